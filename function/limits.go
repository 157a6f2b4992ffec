package function

import (
	"context"
	"sync"
	"time"

	"greenhouse-gateway/internal/cloud"
	"greenhouse-gateway/internal/tablewrite"
)

// probeTimeout bounds one probe of the transaction limit.
const probeTimeout = 10 * time.Second

// txLimit is the endpoint's TransactWriteItems action limit in one
// execution environment: TRANSACTION_MAX_ITEMS, or probed
// (cloud.ProbeTransactionLimit, as the gateway's uplink does) when a
// batch first needs it and again after the endpoint refused a transaction
// for its size.
type txLimit struct {
	mu sync.Mutex
	n  int // 0 until probed
}

// transactionLimit returns the limit to write a batch with. When the
// probe fails it returns 0: the batch is written the split way (readings,
// then the marker), which needs no transaction, and the next batch probes
// again.
func (f *Function) transactionLimit(ctx context.Context) int {
	if f.cfg.TransactionMaxItems != 0 {
		return f.cfg.TransactionMaxItems
	}
	f.limit.mu.Lock()
	defer f.limit.mu.Unlock()
	if f.limit.n > 0 {
		return f.limit.n
	}
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	n, err := cloud.ProbeTransactionLimit(ctx, f.db, f.cfg.Tables.ProcessedBatches)
	if err != nil {
		f.logger.Warn("the transaction limit could not be probed; the batch is written without a transaction", "err", err)
		return 0
	}
	f.limit.n = n
	f.logger.Info("transaction item limit probed", "items", n)
	return n
}

// call runs one request of the writer. A refusal of a request's shape or
// of the endpoint's limits is logged, and the batch retried (503 to a
// device, error to a gateway); a refusal of a transaction's number of
// actions makes the next batch probe the limit again.
func (f *Function) call(ctx context.Context, r *tablewrite.Request) error {
	err := r.Send(ctx)
	observed(ctx).consumed(r.Op, r.Consumed)
	if e := r.Refused; e != nil {
		if e.Cause == tablewrite.CauseTransactionLimit {
			f.limit.mu.Lock()
			f.limit.n = 0
			f.limit.mu.Unlock()
		}
		f.logger.Warn("DynamoDB refused a request, not its batch; the batch is answered as to be retried",
			"operation", e.Op, "cause", e.Cause, "err", e.Err)
	}
	return err
}
