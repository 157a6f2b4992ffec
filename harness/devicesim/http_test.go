package devicesim

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/firmware-contract"
)

// fakeGateway mimics the gateway's device HTTP API as the contract describes it. The first
// readings request of each device is answered 507 with Retry-After; later ones are stored
// and answered 200, "duplicate" for a batch already stored with the same content.
type fakeGateway struct {
	t      testing.TB
	apiKey string

	mu           sync.Mutex
	registered   map[string]string           // hardware_id -> confirmation_id
	stored       map[string]string           // batch_id -> IdentityHash
	full         map[string]time.Time        // hardware_id -> time of its 507
	retryGap     map[string]time.Duration    // hardware_id -> time from the 507 to the next try
	firstByBatch map[string]contract.Reading // batch_id -> first reading as stored
	regCodes     map[string][]int            // hardware_id -> status code of every registration
	regBoots     map[string][]string         // hardware_id -> boot_id of every registration
	batchBoots   map[string]string           // batch_id -> boot_id
}

func newFakeGateway(t testing.TB, apiKey string) *fakeGateway {
	return &fakeGateway{t: t, apiKey: apiKey,
		registered: map[string]string{}, stored: map[string]string{},
		full: map[string]time.Time{}, retryGap: map[string]time.Duration{},
		firstByBatch: map[string]contract.Reading{}, regCodes: map[string][]int{},
		regBoots: map[string][]string{}, batchBoots: map[string]string{}}
}

func (g *fakeGateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	if r.Header.Get("Authorization") != "Bearer "+g.apiKey {
		writeJSON(w, http.StatusUnauthorized, contract.RequestErrorResponse("unknown api key"))
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	switch r.URL.Path {
	case "/v1/register":
		reg, err := contract.DecodeRegistration(body, "")
		if err != nil {
			writeJSON(w, http.StatusBadRequest, contract.RegisterAck("", err))
			return
		}
		code := http.StatusOK
		if _, ok := g.registered[reg.HardwareID]; !ok {
			g.registered[reg.HardwareID] = uuid.NewString()
			code = http.StatusCreated
		}
		g.regCodes[reg.HardwareID] = append(g.regCodes[reg.HardwareID], code)
		g.regBoots[reg.HardwareID] = append(g.regBoots[reg.HardwareID], reg.BootID)
		writeJSON(w, code, contract.RegisterAck(g.registered[reg.HardwareID], nil))
	case "/v1/readings":
		b, err := contract.DecodeBatch(body, "", contract.Limits{}, time.Now())
		if err != nil {
			resp := contract.NewReadingsResponse([]contract.Result{contract.NewResult("", "", err)})
			writeJSON(w, resp.HTTPStatus(), resp)
			return
		}
		if _, ok := g.registered[b.HardwareID]; !ok {
			g.t.Errorf("readings from %s before its registration", b.HardwareID)
		}
		at, wasFull := g.full[b.HardwareID]
		if !wasFull {
			g.full[b.HardwareID] = time.Now()
			reason, msg := contract.ReasonBufferFull, "buffer full, retry later"
			resp := contract.NewReadingsResponse([]contract.Result{
				{BatchID: b.BatchID, Status: contract.StatusRejected, Reason: &reason, Message: &msg}})
			w.Header().Set("Retry-After", "1")
			writeJSON(w, resp.HTTPStatus(), resp)
			return
		}
		if _, ok := g.retryGap[b.HardwareID]; !ok {
			g.retryGap[b.HardwareID] = time.Since(at)
		}
		id := b.IdentityHash()
		hash := string(id[:])
		status := contract.StatusAccepted
		if prev, ok := g.stored[b.BatchID]; ok {
			if prev != hash {
				g.t.Errorf("batch %s re-sent with other content", b.BatchID)
			}
			status = contract.StatusDuplicate
		}
		g.stored[b.BatchID] = hash
		g.firstByBatch[b.BatchID] = b.Readings[0]
		g.batchBoots[b.BatchID] = b.BootID
		resp := contract.NewReadingsResponse([]contract.Result{contract.NewResult(b.BatchID, status, nil)})
		writeJSON(w, resp.HTTPStatus(), resp)
	default:
		http.NotFound(w, r)
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func TestHTTPModeAgainstGateway(t *testing.T) {
	gw := newFakeGateway(t, "secret")
	srv := httptest.NewServer(gw)
	t.Cleanup(srv.Close)

	cfg := fastConfig(50*time.Millisecond, 100*time.Millisecond, 10*time.Second)
	cfg.HTTPURL = srv.URL
	cfg.APIKey = "secret"
	cfg.Devices = 2
	cfg.Readings = 5
	cfg.Batches = 3
	cfg.Seed = 1

	sim, lines := runWithReport(t, cfg)
	require.Len(t, lines, 6, "every batch got a final answer")

	gw.mu.Lock()
	defer gw.mu.Unlock()
	require.Len(t, gw.registered, 2)
	require.Len(t, gw.stored, 6)
	perDevice := map[string][]uint64{}
	for _, l := range lines {
		require.Equal(t, "accepted", l.Status, "the 507 was retried, not final")
		require.Contains(t, gw.stored, l.BatchID)
		require.Equal(t, 5, l.Readings)
		require.Equal(t, gw.firstByBatch[l.BatchID].TimestampMS, l.FirstTimestampMS)
		perDevice[l.HardwareID] = append(perDevice[l.HardwareID], l.Seq)
	}
	require.Equal(t, sim.HardwareIDs(), []string{"02:00:00:00:00:01", "02:00:00:00:00:02"})
	for _, hw := range sim.HardwareIDs() {
		seqs := perDevice[hw]
		sort.Slice(seqs, func(i, j int) bool { return seqs[i] < seqs[j] })
		require.Equal(t, []uint64{0, 1, 2}, seqs, hw)
		require.GreaterOrEqual(t, gw.retryGap[hw], 990*time.Millisecond, "Retry-After: 1 is honoured by %s", hw)
	}

	stats := sim.Stats()
	require.Len(t, stats, 2)
	for _, st := range stats {
		require.True(t, st.Registered)
		require.Equal(t, 3, st.Built)
		require.Equal(t, 3, st.Accepted)
		require.Equal(t, 1, st.Retried["buffer_full"])
		require.Zero(t, st.Pending)
	}
}

// TestHTTPModeReboots: devices that reboot register with POST /v1/register at every boot
// (201 the first time, 200 after), with a fresh boot_id, and every batch is confirmed.
func TestHTTPModeReboots(t *testing.T) {
	gw := newFakeGateway(t, "secret")
	srv := httptest.NewServer(gw)
	t.Cleanup(srv.Close)

	cfg := fastConfig(50*time.Millisecond, 100*time.Millisecond, 10*time.Second)
	cfg.HTTPURL = srv.URL
	cfg.APIKey = "secret"
	cfg.Devices = 2
	cfg.Readings = 5
	cfg.Duration = 1500 * time.Millisecond
	cfg.RebootEvery = 400 * time.Millisecond
	cfg.Reboots = 2
	cfg.Seed = 3

	sim, lines := runWithReport(t, cfg)

	gw.mu.Lock()
	defer gw.mu.Unlock()
	stats := sim.Stats()
	require.Len(t, stats, 2)
	for _, st := range stats {
		hw := st.HardwareID
		require.Equal(t, 2, st.Reboots)
		require.Equal(t, []int{201, 200, 200}, gw.regCodes[hw], "a registration per boot")
		boots := gw.regBoots[hw]
		require.Len(t, boots, 3)
		require.NotEqual(t, boots[0], boots[1])
		require.NotEqual(t, boots[1], boots[2])
		require.Equal(t, boots[2], st.BootID)
		require.Equal(t, 3, st.Registrations)
		require.Equal(t, gw.registered[hw], st.ConfirmationID)
		require.Zero(t, st.Pending)
		require.Equal(t, st.Built, st.Accepted)
	}
	require.Len(t, lines, stats[0].Built+stats[1].Built)
	bootsSeen := map[string]bool{}
	for _, l := range lines {
		require.Equal(t, "accepted", l.Status)
		require.Equal(t, gw.batchBoots[l.BatchID], l.BootID, "the report has the batch's own boot_id")
		require.Contains(t, gw.regBoots[l.HardwareID], l.BootID, "batches come from registered boots")
		bootsSeen[l.BootID] = true
	}
	require.Len(t, bootsSeen, 6, "every boot of both devices delivered batches")
}

func TestHTTPModeWrongKeyKeepsBatches(t *testing.T) {
	srv := httptest.NewServer(newFakeGateway(t, "secret"))
	t.Cleanup(srv.Close)

	cfg := fastConfig(20*time.Millisecond, 50*time.Millisecond, 300*time.Millisecond)
	cfg.HTTPURL = srv.URL
	cfg.APIKey = "wrong"
	cfg.Devices = 1
	cfg.Batches = 2
	sim, err := New(cfg, testLogger(t))
	require.NoError(t, err)
	require.NoError(t, sim.Run(t.Context()), "a refused key is not a setup error")
	st := sim.Stats()[0]
	require.False(t, st.Registered)
	require.Equal(t, 2, st.Pending, "firmware keeps its data while the key is refused")
	require.Positive(t, st.Retried["transport"])
	require.Empty(t, st.Rejected)
}

func TestReadingsEvent(t *testing.T) {
	const id = "02:00:00:00:00:01_b_1_2"
	now := time.Date(2025, 3, 1, 0, 0, 0, 0, time.UTC)
	result := func(status contract.Status, reason contract.Reason) []byte {
		r := contract.Result{BatchID: id, Status: status}
		if reason != "" {
			r.Reason = &reason
		}
		b, err := json.Marshal(contract.NewReadingsResponse([]contract.Result{r}))
		require.NoError(t, err)
		return b
	}
	tests := []struct {
		name       string
		code       int
		retryAfter string
		body       []byte
		wantKind   eventKind
		wantStatus contract.Status
		wantReason string
		wantWait   time.Duration
		wantErr    error
	}{
		{name: "200 accepted", code: 200, body: result(contract.StatusAccepted, ""),
			wantKind: evAck, wantStatus: contract.StatusAccepted},
		{name: "200 duplicate", code: 200, body: result(contract.StatusDuplicate, ""),
			wantKind: evAck, wantStatus: contract.StatusDuplicate},
		{name: "507 with result", code: 507, retryAfter: "7", body: result(contract.StatusRejected, contract.ReasonBufferFull),
			wantKind: evAck, wantStatus: contract.StatusRejected, wantReason: "buffer_full", wantWait: 7 * time.Second},
		{name: "400 with result", code: 400, body: result(contract.StatusRejected, contract.ReasonValidation),
			wantKind: evAck, wantStatus: contract.StatusRejected, wantReason: "validation_error"},
		{name: "409 with result", code: 409, body: result(contract.StatusRejected, contract.ReasonConflict),
			wantKind: evAck, wantStatus: contract.StatusRejected, wantReason: "conflict"},
		{name: "403 forbidden", code: 403, body: result(contract.StatusRejected, contract.ReasonForbidden),
			wantKind: evAck, wantStatus: contract.StatusRejected, wantReason: "forbidden"},
		{name: "403 device key required", code: 403, body: result(contract.StatusRejected, contract.ReasonDeviceKeyRequired),
			wantKind: evAck, wantStatus: contract.StatusRejected, wantReason: "device_key_required"},
		{name: "403 without results", code: 403, body: []byte(`{"status":"error","results":[],"message":"forbidden"}`),
			wantKind: evSendFailed, wantErr: errUnauthorized},
		{name: "other batch's result", code: 200, body: []byte(`{"status":"ok","results":[{"batch_id":"x","status":"accepted"}]}`),
			wantKind: evSendFailed},
		{name: "507 without body", code: 507, retryAfter: "3", wantKind: evSendFailed, wantWait: 3 * time.Second},
		{name: "503 shutting down", code: 503, retryAfter: "2", body: []byte(`{"status":"error","results":[],"message":"shutting down"}`),
			wantKind: evSendFailed, wantWait: 2 * time.Second},
		{name: "429", code: 429, retryAfter: "1", wantKind: evSendFailed, wantWait: time.Second},
		{name: "502 from a proxy", code: 502, body: []byte("<html>bad gateway</html>"), wantKind: evSendFailed},
		{name: "401", code: 401, body: []byte(`{"status":"error","results":[],"message":"bad key"}`),
			wantKind: evSendFailed, wantErr: errUnauthorized},
		{name: "413", code: 413, body: []byte(`{"status":"error","results":[],"message":"too large"}`),
			wantKind: evAck, wantStatus: contract.StatusRejected, wantReason: "http_413"},
		{name: "400 without results", code: 400, body: []byte(`{"status":"error","results":[],"message":"unreadable"}`),
			wantKind: evAck, wantStatus: contract.StatusRejected, wantReason: "validation_error"},
		{name: "404", code: 404, body: []byte("404 page not found"),
			wantKind: evAck, wantStatus: contract.StatusRejected, wantReason: "http_404"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev := readingsEvent(id, tt.code, tt.retryAfter, tt.body, now)
			require.Equal(t, tt.wantKind, ev.kind)
			require.Equal(t, tt.wantWait, ev.retryAfter)
			switch ev.kind {
			case evAck:
				require.Equal(t, contract.AckTypeReadings, ev.ack.Type)
				require.Equal(t, id, ev.ack.BatchID)
				require.Equal(t, tt.wantStatus, ev.ack.Status)
				require.Equal(t, tt.wantReason, reasonOf(ev.ack.Reason))
			case evSendFailed:
				require.Equal(t, id, ev.batchID)
				require.Error(t, ev.err)
				if tt.wantErr != nil {
					require.True(t, errors.Is(ev.err, tt.wantErr))
				}
			}
		})
	}
}

func TestRegisterEvent(t *testing.T) {
	now := time.Date(2025, 3, 1, 0, 0, 0, 0, time.UTC)
	ev := registerEvent(201, "", []byte(`{"type":"register","status":"registered","confirmation_id":"550e8400-e29b-41d4-a716-446655440000"}`), now)
	require.Equal(t, evAck, ev.kind)
	require.Equal(t, contract.StatusRegistered, ev.ack.Status)
	require.Equal(t, "550e8400-e29b-41d4-a716-446655440000", ev.ack.ConfirmationID)
	require.Equal(t, 201, ev.httpStatus)

	ev = registerEvent(200, "", []byte(`{"type":"register","status":"registered","confirmation_id":"550e8400-e29b-41d4-a716-446655440000"}`), now)
	require.Equal(t, contract.StatusRegistered, ev.ack.Status, "200: registered again")
	require.Equal(t, "550e8400-e29b-41d4-a716-446655440000", ev.ack.ConfirmationID)
	require.Equal(t, 200, ev.httpStatus)

	ev = registerEvent(200, "", nil, now)
	require.Equal(t, contract.StatusRegistered, ev.ack.Status, "200 confirms even without a body")
	require.Empty(t, ev.ack.ConfirmationID)

	ev = registerEvent(400, "", []byte(`{"type":"register","status":"rejected","reason":"validation_error","message":"boot_id: bad"}`), now)
	require.Equal(t, evAck, ev.kind)
	require.Equal(t, contract.StatusRejected, ev.ack.Status)
	require.Equal(t, "validation_error", reasonOf(ev.ack.Reason))
	require.Equal(t, "boot_id: bad", deref(ev.ack.Message), "the gateway's own message is kept")

	ev = registerEvent(400, "", []byte(`{"status":"error","results":[],"message":"unreadable"}`), now)
	require.Equal(t, evAck, ev.kind)
	require.Equal(t, contract.StatusRejected, ev.ack.Status)
	require.Equal(t, "validation_error", reasonOf(ev.ack.Reason))
	require.Contains(t, deref(ev.ack.Message), "unreadable")

	ev = registerEvent(507, "30", []byte(`{"type":"register","status":"rejected","reason":"buffer_full","message":"retry later"}`), now)
	require.Equal(t, evAck, ev.kind)
	require.Equal(t, contract.StatusRejected, ev.ack.Status)
	require.Equal(t, "buffer_full", reasonOf(ev.ack.Reason))
	require.Equal(t, 30*time.Second, ev.retryAfter)

	// The enrolling answer passes the device key on.
	ev = registerEvent(201, "", []byte(`{"type":"register","status":"registered","confirmation_id":"550e8400-e29b-41d4-a716-446655440000",`+
		`"device_key":"`+testDevKey+`","device_key_id":"`+testDevKeyID+`"}`), now)
	require.Equal(t, evAck, ev.kind)
	require.Equal(t, testDevKey, ev.ack.DeviceKey)
	require.Equal(t, testDevKeyID, ev.ack.DeviceKeyID)

	ev = registerEvent(403, "", []byte(`{"type":"register","status":"rejected","reason":"device_key_required","message":"use the device key"}`), now)
	require.Equal(t, evAck, ev.kind)
	require.Equal(t, contract.StatusRejected, ev.ack.Status)
	require.Equal(t, "device_key_required", reasonOf(ev.ack.Reason))
	require.Equal(t, "use the device key", deref(ev.ack.Message))

	ev = registerEvent(401, "", nil, now)
	require.Equal(t, evRegisterFailed, ev.kind)
	require.ErrorIs(t, ev.err, errUnauthorized)

	ev = registerEvent(503, "", []byte(`{"status":"error","results":[],"message":"shutting down"}`), now)
	require.Equal(t, evRegisterFailed, ev.kind)
}
