package gateway

import (
	"context"
	"errors"
	"sync"
)

// stages runs the gateway's long-running parts and stops them in steps, in
// the order the steps were added: each step starts once the one before it
// returned, so that the shutdown order is the order of the code that adds
// them.
type stages struct {
	// tripped is done when the parent context is done or a part failed.
	tripped context.Context
	trip    context.CancelCauseFunc
	steps   []func() error

	mu   sync.Mutex
	errs []error // of the parts that failed
}

func newStages(ctx context.Context) *stages {
	tripped, trip := context.WithCancelCause(ctx)
	return &stages{tripped: tripped, trip: trip}
}

// then adds a shutdown step.
func (s *stages) then(step func() error) { s.steps = append(s.steps, step) }

// stage adds a step that stops the parts run in the returned stage: their
// context is cancelled and the step returns once they all returned.
func (s *stages) stage() *stage {
	ctx, cancel := context.WithCancel(context.Background())
	st := &stage{s: s, ctx: ctx, cancel: cancel}
	s.then(st.stop)
	return st
}

// failed records a part's error and starts the shutdown.
func (s *stages) failed(err error) {
	s.mu.Lock()
	s.errs = append(s.errs, err)
	s.mu.Unlock()
	s.trip(err)
}

// stopping reports whether the shutdown was asked for.
func (s *stages) stopping() bool { return s.tripped.Err() != nil }

// wait returns when the parent context is done or a part failed.
func (s *stages) wait() { <-s.tripped.Done() }

// stop runs the shutdown steps in order and returns the parts' and the
// steps' errors.
func (s *stages) stop() error {
	var errs []error
	for _, step := range s.steps {
		errs = append(errs, step())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return errors.Join(append(s.errs, errs...)...)
}

// stage is a group of parts that stop together.
type stage struct {
	s      *stages
	ctx    context.Context
	cancel context.CancelFunc
	parts  sync.WaitGroup
}

// run runs part until the stage stops; an error from it (a nil return
// before that is fine) shuts the gateway down.
func (st *stage) run(part func(context.Context) error) {
	st.parts.Go(func() {
		if err := part(st.ctx); err != nil {
			st.s.failed(err)
		}
	})
}

func (st *stage) stop() error {
	st.cancel()
	st.parts.Wait()
	return nil
}
