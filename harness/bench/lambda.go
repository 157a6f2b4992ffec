//go:build linux

package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"

	"greenhouse-gateway/harness/lambdatest"
)

// lambdaDrain drains the same size of backlog twice in one run: gatewayd
// writing DynamoDB Local directly (the baseline), then gatewayd with
// uplink.target lambda invoking the readings function under the Runtime
// Interface Emulator, which writes the same DynamoDB Local. It reports the
// drain rate against the baseline, the device batches per invocation and
// the invocations per reading.
func (r *runner) lambdaDrain(ctx context.Context) error {
	if r.txLimit == 0 {
		// Warms DynamoDB Local and probes its transaction limit, as the
		// drain scenario does.
		if _, err := r.warmDynamo(ctx); err != nil {
			return err
		}
	}
	bootstrap, err := lambdatest.FunctionBinary()
	if err != nil {
		return err
	}
	target := func(ctx context.Context, prefix string) ([]string, func(), error) {
		em, err := lambdatest.Run(bootstrap, map[string]string{
			"API_KEY_PEPPER": pepper, "TABLE_PREFIX": prefix, "DYNAMODB_ENDPOINT": r.dynamo.endpoint,
			"TRANSACTION_MAX_ITEMS": strconv.Itoa(r.txLimit), "AWS_REGION": awsRegion,
			"AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local",
		})
		if err != nil {
			return nil, nil, err
		}
		env := []string{"GATEWAY_UPLINK_TARGET=lambda", "GATEWAY_UPLINK_LAMBDA_FUNCTION=" + lambdatest.FunctionName,
			"GATEWAY_UPLINK_LAMBDA_ENDPOINT=" + em.Endpoint}
		return env, func() { _ = em.Close() }, nil
	}
	batches := r.cfg.DrainReadings / r.cfg.Readings
	var runs [2]gatewayDrain
	for i, t := range []drainTarget{nil, target} {
		dir := filepath.Join(r.work, fmt.Sprintf("drain-lambda-%d", i))
		r.log.Info("lambda drain: writing the backlog", "through_lambda", t != nil, "batches", batches)
		bl, err := fillBacklog(ctx, dir, r.nextFleet(), r.cfg.maxDevices(), batches, r.cfg.Readings)
		if err != nil {
			return err
		}
		if runs[i], err = r.gatewayDrain(ctx, r.dynamo.client, dir, "transaction", t); err != nil {
			return err
		}
		if g := runs[i]; g.ReadingsStored != int64(bl.Readings) || g.MarkersStored != int64(bl.Batches) {
			r.res.note("drain through lambda: counts differ (through lambda: %v): backlog %d readings in %d batches; "+
				"tables hold %d readings, %d markers", t != nil, bl.Readings, bl.Batches, g.ReadingsStored, g.MarkersStored)
		}
	}
	r.reportLambdaDrain(runs[0], runs[1], batches)
	return nil
}

// reportLambdaDrain adds the figures of a drain through the function (via)
// against the direct one.
func (r *runner) reportLambdaDrain(direct, via gatewayDrain, batches int) {
	const section = "drain through lambda"
	r.res.Details[section] = map[string]gatewayDrain{"direct": direct, "lambda": via}
	var requests float64
	for _, n := range direct.Requests {
		requests += n
	}
	r.res.add(section, "readings/s until pending is 0", "readings/s", via.Readings/via.Seconds, direct.Readings/direct.Seconds,
		"gatewayd writing DynamoDB directly, same backlog size", ratioAtLeast(0.8))
	r.res.add(section, "device batches per invocation", "batches", via.InvokedBatches/via.Invocations, direct.Markers/requests,
		"batches per DynamoDB request, direct", atLeast(50, "batches"))
	r.res.add(section, "invocations per reading", "inv", via.Invocations/via.Readings, requests/direct.Readings,
		"DynamoDB requests per reading, direct", nil)
	r.res.note("%s: %d readings from %d devices, %d a batch; %.0f invocations carried %.0f batches; the Runtime Interface "+
		"Emulator runs one invocation at a time (invokeproxy queues the others), so the Lambda path here is one function "+
		"instance: its rate is a floor of what Lambda's concurrent instances give, and the queue makes invocations fuller",
		section, batches*r.cfg.Readings, r.cfg.maxDevices(), r.cfg.Readings, via.Invocations, via.InvokedBatches)
}
