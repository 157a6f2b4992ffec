package uplink

import (
	"context"
	"errors"
	"sync"
	"time"

	"greenhouse-gateway/function/event"
)

// The lambda target's report (event.UplinkReport): every event the
// uplink sends carries the gateway's backlog, the batches delivered since
// the last answered report and the class of the last failure since then,
// and the function turns it into CloudWatch metrics per gateway. While
// nothing else is sent (no batches, nothing to write), an empty event
// carries it every uplink.lambda.report_interval, so a gateway that
// reports nothing is one that cannot.

// reportState is what the next report says besides the backlog.
type reportState struct {
	u          *Uplink
	mu         sync.Mutex
	delivered  int64     // batches recorded delivered, not in an answered report
	errClass   string    // the last failure's class, not in an answered report
	answeredAt time.Time // the last invocation the function answered
	idleAt     time.Time // the last idle report sent
}

// take returns the report for an event about to be sent, and the function
// to call with whether the function answered it: an unanswered report's
// deliveries and error class go in the next one.
func (s *reportState) take() (*event.UplinkReport, func(answered bool)) {
	r := &event.UplinkReport{}
	st := s.u.store.Stats()
	r.PendingBatches = st.PendingBatches
	if !st.Oldest.IsZero() {
		r.OldestPendingAgeSeconds = max(0, s.u.clock.Now().Sub(st.Oldest).Seconds())
	}
	s.mu.Lock()
	r.DeliveredBatches, s.delivered = s.delivered, 0
	r.LastErrorClass, s.errClass = s.errClass, ""
	s.mu.Unlock()
	return r, func(answered bool) {
		s.mu.Lock()
		defer s.mu.Unlock()
		if answered {
			s.answeredAt = time.Now()
			return
		}
		s.delivered += r.DeliveredBatches
		if s.errClass == "" {
			s.errClass = r.LastErrorClass
		}
	}
}

// addDelivered counts batches recorded delivered.
func (s *reportState) addDelivered(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.delivered += int64(n)
}

// failed notes a failure: an invocation or a batch's result as they
// happen (invoke, apply), anything else when its round fails (setDown:
// classes other than gateway were noted already).
func (s *reportState) failed(err error, round bool) {
	c := errorClass(err)
	if round && c != "gateway" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.errClass = c
}

// quietFor returns how long ago the function last answered an invocation
// or an idle report was sent (since start when neither happened).
func (s *reportState) quietFor(start time.Time) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	last := start
	for _, t := range []time.Time{s.answeredAt, s.idleAt} {
		if t.After(last) {
			last = t
		}
	}
	return time.Since(last)
}

// errorClass is a failed round's class (event.ErrorClasses).
func errorClass(err error) string {
	var ie *invocationError
	var re *resultErr
	switch {
	case unreachable(err):
		return "unreachable"
	case errors.As(err, &ie) && ie.kind == "throttled":
		return "invocation_throttled"
	case errors.As(err, &ie) && ie.kind == "function_error":
		return "function_error"
	case errors.As(err, &ie):
		return "invocation_error"
	case errors.As(err, &re) && re.status == event.StatusThrottled:
		return "throttled"
	case errors.As(err, &re):
		return "cloud_error"
	}
	return "gateway"
}

// resultErr is a result that is neither delivered nor a permanent
// refusal (resultError).
type resultErr struct {
	status string // "" when the answer had no result for the id
	msg    string
}

func (e *resultErr) Error() string { return e.msg }

// idleWait bounds an idle uplink's wait for new batches: until the idle
// report is due (at least a millisecond), or wait itself without the
// lambda target.
func (u *Uplink) idleWait(wait time.Duration) time.Duration {
	if u.lambda == nil {
		return wait
	}
	due := u.cfg.Lambda.ReportInterval - u.lambda.reports.quietFor(u.lambda.started)
	return max(min(wait, due), time.Millisecond)
}

// idleReport sends the report in an empty event when the function
// answered no invocation, and no idle report was sent, for
// uplink.lambda.report_interval. It changes nothing else: a failure is
// the next round's to find.
func (u *Uplink) idleReport(ctx context.Context) {
	if u.lambda == nil || u.lambda.reports.quietFor(u.lambda.started) < u.cfg.Lambda.ReportInterval {
		return
	}
	u.lambda.reports.mu.Lock()
	u.lambda.reports.idleAt = time.Now()
	u.lambda.reports.mu.Unlock()
	if _, err := u.lambda.invoke(ctx, &event.BatchEvent{}); err != nil {
		u.logger.Debug("the idle report was not answered", "err", err)
	}
}
