//go:build linux

package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"greenhouse-gateway/harness/invokeproxy"
	"greenhouse-gateway/harness/lambdatest"
	"greenhouse-gateway/uplink"
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
	rie, bootstrap, err := functionBinaries()
	if err != nil {
		return err
	}
	var inv functionInvocations
	target := func(ctx context.Context, prefix string) ([]string, func(), error) {
		url, stop, err := r.startFunctions(rie, bootstrap, prefix, &inv)
		if err != nil {
			return nil, nil, err
		}
		return lambdaTargetEnv(url), stop, nil
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
		// The direct run uses the default write mode, the one a gateway
		// without the function would run.
		if runs[i], err = r.gatewayDrain(ctx, r.dynamo.client, dir, uplink.DefaultConfig().WriteMode, "", t); err != nil {
			return err
		}
		if g := runs[i]; g.ReadingsStored != int64(bl.Readings) || g.MarkersStored != int64(bl.Batches) {
			r.res.note("drain through lambda: counts differ (through lambda: %v): backlog %d readings in %d batches; "+
				"tables hold %d readings, %d markers", t != nil, bl.Readings, bl.Batches, g.ReadingsStored, g.MarkersStored)
		}
	}
	r.reportLambdaDrain(runs[0], runs[1], batches, inv)
	return nil
}

// functionInvocations sums the readings function's invocation log lines
// (function.Observer): batches, consumed capacity, time by step.
type functionInvocations struct {
	Invocations            int
	Batches                float64
	ReadUnits, WriteUnits  float64
	DurationMS             float64
	PhasesMS               map[string]float64
	HistoryHinted, Queried int
}

// add sums the invocation lines of one emulator's output.
func (fi *functionInvocations) add(output string) {
	for line := range strings.Lines(output) {
		var l struct {
			Msg        string             `json:"msg"`
			Batches    map[string]float64 `json:"batches"`
			ReadUnits  float64            `json:"read_units"`
			WriteUnits float64            `json:"write_units"`
			DurationMS float64            `json:"duration_ms"`
			Phases     map[string]float64 `json:"phases_ms"`
			Hinted     int                `json:"history_hinted"`
			Queried    int                `json:"history_queried"`
		}
		if json.Unmarshal([]byte(line), &l) != nil || l.Msg != "invocation" {
			continue
		}
		fi.Invocations++
		for _, n := range l.Batches {
			fi.Batches += n
		}
		fi.ReadUnits += l.ReadUnits
		fi.WriteUnits += l.WriteUnits
		fi.DurationMS += l.DurationMS
		if fi.PhasesMS == nil {
			fi.PhasesMS = map[string]float64{}
		}
		for k, v := range l.Phases {
			fi.PhasesMS[k] += v
		}
		fi.HistoryHinted += l.Hinted
		fi.Queried += l.Queried
	}
}

// functionBinaries builds the Runtime Interface Emulator and the readings
// function, once.
func functionBinaries() (rie, bootstrap string, err error) {
	if bootstrap, err = lambdatest.FunctionBinary(); err != nil {
		return "", "", err
	}
	rie, err = lambdatest.BuildRIE()
	return rie, bootstrap, err
}

// startFunctions runs LambdaInstances emulators of the function for the
// tables of prefix and returns the Invoke API's URL: the emulator's proxy,
// or with several, an invokeproxy that passes each invoke to a free one.
// With inv, the emulators' invocation lines are added to it when they stop.
func (r *runner) startFunctions(rie, bootstrap, prefix string, inv *functionInvocations) (string, func(), error) {
	var ems []*lambdatest.Emulator
	stop := func() {
		for _, em := range ems {
			if inv != nil {
				inv.add(em.Output())
			}
			_ = em.Close()
		}
	}
	var urls []string
	for range r.cfg.LambdaInstances {
		em, err := lambdatest.Launch(rie, bootstrap, map[string]string{
			"API_KEY_PEPPER": pepper, "TABLE_PREFIX": prefix, "DYNAMODB_ENDPOINT": r.dynamo.endpoint,
			"TRANSACTION_MAX_ITEMS": strconv.Itoa(r.txLimit), "AWS_REGION": awsRegion,
			"AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local",
		})
		if err != nil {
			stop()
			return "", nil, err
		}
		ems = append(ems, em)
		urls = append(urls, em.Endpoint)
	}
	if len(urls) == 1 {
		return urls[0], stop, nil
	}
	p, err := invokeproxy.New(urls, 0, r.log)
	if err == nil {
		err = p.Listen("127.0.0.1:0")
	}
	if err != nil {
		stop()
		return "", nil, err
	}
	go func() { _ = p.Run(context.Background()) }()
	return p.URL(), func() { _ = p.Close(); stop() }, nil
}

// reportLambdaDrain adds the figures of a drain through the function (via)
// against the direct one.
func (r *runner) reportLambdaDrain(direct, via gatewayDrain, batches int, inv functionInvocations) {
	const section = "drain through lambda"
	r.res.Details[section] = map[string]any{"direct": direct, "lambda": via, "function": inv}
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
	if inv.Batches > 0 {
		r.res.add(section, "function read capacity per batch", "RCU", inv.ReadUnits/inv.Batches, 0,
			"", nil)
		r.res.add(section, "function write capacity per batch", "WCU", inv.WriteUnits/inv.Batches, 0, "", nil)
		var steps []string
		for _, k := range slices.Sorted(maps.Keys(inv.PhasesMS)) {
			steps = append(steps, fmt.Sprintf("%s %.0f ms", k, inv.PhasesMS[k]))
		}
		r.res.note("%s: the function's %d invocations took %.0f ms (%s); devices' newest readings from the event's "+
			"history hints %d times, read %d times", section, inv.Invocations, inv.DurationMS, strings.Join(steps, ", "),
			inv.HistoryHinted, inv.Queried)
	}
	r.res.note("%s: %d readings from %d devices, %d a batch; %.0f invocations carried %.0f batches; %d Runtime Interface "+
		"Emulator(s), each running one invocation at a time (invokeproxy queues the others), stand for as many concurrent "+
		"Lambda instances: the rate is a floor of what Lambda gives at a higher concurrency, and the queue makes invocations fuller",
		section, batches*r.cfg.Readings, r.cfg.maxDevices(), r.cfg.Readings, via.Invocations, via.InvokedBatches, r.cfg.LambdaInstances)
}
