package contract

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"
	"unicode"
	"unicode/utf8"
)

// Validate checks the value rules of the contract on b: identity formats,
// batch_id prefix, counts, timestamp range and uniqueness, clock skew against
// now (skipped when now is zero), sensor names and values, sensor statuses.
// It does not know the sender, so it does not check hardware_id against it.
//
// Readings dated before 2000-01-01 pass when they can be repaired (they have
// uptime_ms and the batch has sent_uptime_ms) and have not been repaired yet;
// readings the gateway repaired (TimeSource "gateway") must be in range. The
// ingest path calls Validate again after [Batch.RepairClock].
//
// The error is always an *Error.
func (b *Batch) Validate(lim Limits, now time.Time) error {
	if e := b.validate(lim.withDefaults(), now, ""); e != nil {
		e.BatchID = b.BatchID
		return e
	}
	return nil
}

// identityErr checks a message's hardware_id and boot_id; sender is the
// hardware_id the message came from, which hardware_id must equal unless
// it is empty.
func identityErr(hardwareID, bootID, sender string) *Error {
	if rule := hardwareIDRule(hardwareID); rule != "" {
		return validationErr("hardware_id", rule)
	}
	if sender != "" && hardwareID != sender {
		return validationErr("hardware_id", fmt.Sprintf("must be the sender's hardware_id %s, got %s", quoteForPath(sender), hardwareID))
	}
	if rule := uuidV4Rule(bootID); rule != "" {
		return validationErr("boot_id", rule)
	}
	return nil
}

func (b *Batch) validate(lim Limits, now time.Time, sender string) *Error {
	if e := identityErr(b.HardwareID, b.BootID, sender); e != nil {
		return e
	}
	if rule := batchIDRule(b.BatchID, b.HardwareID); rule != "" {
		return validationErr("batch_id", rule)
	}
	if rule := firmwareVersionRule(b.FirmwareVersion); rule != "" {
		return validationErr("firmware_version", rule)
	}
	if b.SentUptimeMS != nil && *b.SentUptimeMS < 0 {
		return validationErr("sent_uptime_ms", "must be a non-negative integer")
	}
	switch n := len(b.Readings); {
	case n == 0:
		return validationErr("readings", "must contain at least 1 reading")
	case n > lim.MaxReadings:
		return validationErr("readings", fmt.Sprintf("must contain at most %d readings", lim.MaxReadings))
	}

	maxTS := int64(math.MaxInt64)
	if !now.IsZero() {
		maxTS = now.UnixMilli() + lim.MaxClockSkew.Milliseconds()
	}
	var clockErr *Error
	for k := range b.Readings {
		r := &b.Readings[k]
		if e := r.validate(k, lim, maxTS); e != nil {
			return e
		}
		if clockErr == nil && r.pendingRepair() && (r.UptimeMS == nil || b.SentUptimeMS == nil) {
			missing := "uptime_ms on this reading"
			if r.UptimeMS != nil {
				missing = "sent_uptime_ms on the batch"
			}
			clockErr = &Error{
				Reason: ReasonClockNotSynced,
				Field:  joinIndex("readings", k) + ".timestamp_ms",
				Rule: fmt.Sprintf("%d is before 2000-01-01T00:00:00Z: the device clock is not synced; "+
					"resend after NTP sync, or send uptime_ms with each reading and sent_uptime_ms with the batch "+
					"so the gateway can repair the time (missing: %s)", r.TimestampMS, missing),
			}
		}
	}
	if e := b.checkUnique(); e != nil {
		return e
	}
	if clockErr != nil {
		return clockErr
	}
	return nil
}

// pendingRepair reports whether r's timestamp is before 2000 and the gateway
// has not repaired it.
func (r *Reading) pendingRepair() bool {
	return r.TimestampMS < MinTimestampMS && r.TimeSource == ""
}

func (r *Reading) validate(k int, lim Limits, maxTS int64) *Error {
	field := func(name string) string { return joinIndex("readings", k) + "." + name }
	switch r.TimeSource {
	case "", TimeSourceGateway:
	default:
		return validationErr(field("time_source"), `must be empty or "gateway"`)
	}
	ts := r.TimestampMS
	switch {
	case ts < MinTimestampMS && r.TimeSource == TimeSourceGateway:
		return validationErr(field("timestamp_ms"), fmt.Sprintf("%d, as repaired by the gateway, is before 2000-01-01T00:00:00Z (%d)", ts, MinTimestampMS))
	case ts >= EndTimestampMS:
		return validationErr(field("timestamp_ms"), fmt.Sprintf("%d is not before 2100-01-01T00:00:00Z (%d); timestamps are milliseconds since 1970-01-01", ts, EndTimestampMS))
	case ts > maxTS:
		return validationErr(field("timestamp_ms"), fmt.Sprintf("%d is later than the gateway's time plus the allowed clock skew of %s (%d, %s); check the device clock",
			ts, lim.MaxClockSkew, maxTS, time.UnixMilli(maxTS).UTC().Format(time.RFC3339Nano)))
	}
	if r.UptimeMS != nil && *r.UptimeMS < 0 {
		return validationErr(field("uptime_ms"), "must be a non-negative integer")
	}
	if len(r.Sensors) > lim.MaxSensors {
		return validationErr(field("sensors"), fmt.Sprintf("must have at most %d entries", lim.MaxSensors))
	}
	if len(r.SensorStatus) > lim.MaxSensors {
		return validationErr(field("sensor_status"), fmt.Sprintf("must have at most %d entries", lim.MaxSensors))
	}
	// Maps iterate in random order: on error, report the smallest offending
	// key so the message is deterministic.
	var badKey, badRule string
	for name, v := range r.Sensors {
		rule := nameRule(name, "sensor name")
		if rule == "" {
			rule = numberRule(v)
		}
		if rule != "" && (badRule == "" || name < badKey) {
			badKey, badRule = name, rule
		}
	}
	if badRule != "" {
		return validationErr(joinKey(field("sensors"), badKey), badRule)
	}
	for name, st := range r.SensorStatus {
		rule := nameRule(name, "sensor name")
		if rule == "" && st != SensorOK && st != SensorError {
			rule = fmt.Sprintf(`must be "ok" or "error", got %s`, quoteForPath(st))
		}
		if rule != "" && (badRule == "" || name < badKey) {
			badKey, badRule = name, rule
		}
	}
	if badRule != "" {
		return validationErr(joinKey(field("sensor_status"), badKey), badRule)
	}
	return nil
}

// checkUnique checks that timestamps are unique within the batch. Readings
// waiting for clock repair are compared by uptime_ms instead, which is what
// their timestamps will be derived from. It reports the duplicate with the
// smallest index, naming the first reading it repeats.
func (b *Batch) checkUnique() *Error {
	rs := b.Readings
	find := firstDuplicateSorted
	if len(rs) <= 32 {
		find = firstDuplicateSmall
	}
	i, j := find(rs)
	if i < 0 {
		return nil
	}
	if rs[i].pendingRepair() {
		return validationErr(joinIndex("readings", i)+".uptime_ms", fmt.Sprintf(
			"duplicates readings[%d].uptime_ms (%d): readings whose time the gateway repairs must have unique uptimes", j, *rs[i].UptimeMS))
	}
	return validationErr(joinIndex("readings", i)+".timestamp_ms", fmt.Sprintf(
		"duplicates readings[%d].timestamp_ms (%d): timestamps must be unique within a batch", j, rs[i].TimestampMS))
}

// uniqueKey is what must be unique: the timestamp, or the uptime for a
// reading waiting for clock repair; ok is false for such a reading without
// an uptime (another rule refuses it).
func (r *Reading) uniqueKey() (k int64, uptime, ok bool) {
	if r.pendingRepair() {
		if r.UptimeMS == nil {
			return 0, false, false
		}
		return *r.UptimeMS, true, true
	}
	return r.TimestampMS, false, true
}

// firstDuplicateSmall compares every pair: quicker than sorting for the
// small batches devices send. i is -1 when all keys are unique.
func firstDuplicateSmall(rs []Reading) (i, j int) {
	for i := 1; i < len(rs); i++ {
		ki, ui, ok := rs[i].uniqueKey()
		if !ok {
			continue
		}
		for j := 0; j < i; j++ {
			if kj, uj, ok := rs[j].uniqueKey(); ok && kj == ki && uj == ui {
				return i, j
			}
		}
	}
	return -1, -1
}

// firstDuplicateSorted finds what firstDuplicateSmall finds by sorting the
// keys: O(n log n) for large batches.
func firstDuplicateSorted(rs []Reading) (int, int) {
	type entry struct {
		k      int64
		uptime bool
		i      int
	}
	es := make([]entry, 0, len(rs))
	for i := range rs {
		if k, u, ok := rs[i].uniqueKey(); ok {
			es = append(es, entry{k, u, i})
		}
	}
	slices.SortFunc(es, func(a, b entry) int {
		if a.uptime != b.uptime {
			if a.uptime {
				return 1
			}
			return -1
		}
		if c := cmp.Compare(a.k, b.k); c != 0 {
			return c
		}
		return a.i - b.i
	})
	bi, bj := -1, -1
	start := 0
	for n := 1; n < len(es); n++ {
		if es[n].k != es[start].k || es[n].uptime != es[start].uptime {
			start = n
			continue
		}
		if n == start+1 && (bi < 0 || es[n].i < bi) {
			bi, bj = es[n].i, es[start].i
		}
	}
	return bi, bj
}

// NeedsClockRepair reports whether some readings are dated before 2000 and
// have not been repaired: [DecodeBatch] returns such a batch only when it can
// be repaired, and the ingest path must call [Batch.RepairClock] and then
// [Batch.Validate] before storing it.
func (b *Batch) NeedsClockRepair() bool {
	for k := range b.Readings {
		if b.Readings[k].pendingRepair() {
			return true
		}
	}
	return false
}

// ClockAnchor returns the epoch milliseconds at which a device booted, from
// the time the gateway received a batch and the batch's sent_uptime_ms:
// anchor = receive_time_ms - sent_uptime_ms. The ingest path computes it at
// the first contact of a boot and keeps it per boot_id, so a re-sent batch is
// repaired the same way.
func ClockAnchor(receivedMS, sentUptimeMS int64) int64 {
	return receivedMS - sentUptimeMS
}

// RepairClock sets, for every reading dated before 2000 that has uptime_ms,
// timestamp_ms = anchorMS + uptime_ms and time_source = "gateway". Readings
// already in range are left alone. Call [Batch.Validate] afterwards: repaired
// timestamps must be unique and in range too.
//
// Compute [Batch.IdentityHash] before repairing: it covers the batch as the
// device sent it.
func (b *Batch) RepairClock(anchorMS int64) {
	for k := range b.Readings {
		r := &b.Readings[k]
		if !r.pendingRepair() || r.UptimeMS == nil {
			continue
		}
		ts := anchorMS + *r.UptimeMS
		if (*r.UptimeMS > 0 && ts < anchorMS) || (*r.UptimeMS < 0 && ts > anchorMS) {
			ts = math.MaxInt64 // overflow: Validate rejects it as out of range
		}
		r.TimestampMS = ts
		r.TimeSource = TimeSourceGateway
	}
}

// ValidHardwareID checks that s is a hardware_id: a MAC address in upper
// case, ^[0-9A-F]{2}(:[0-9A-F]{2}){5}$. The error is an *Error.
func ValidHardwareID(s string) error {
	if rule := hardwareIDRule(s); rule != "" {
		return validationErr("hardware_id", rule)
	}
	return nil
}

// ValidUUIDv4 checks that s is a UUID version 4 of the RFC 4122 variant in
// the 8-4-4-4-12 hexadecimal form. Hexadecimal digits may be upper or lower
// case (lower case is canonical); the value is kept exactly as written. The
// error is an *Error.
func ValidUUIDv4(s string) error {
	if rule := uuidV4Rule(s); rule != "" {
		return validationErr("", rule)
	}
	return nil
}

func hardwareIDRule(s string) string {
	const form = "must be a MAC address in upper case, like AA:BB:CC:DD:EE:FF (^[0-9A-F]{2}(:[0-9A-F]{2}){5}$)"
	if len(s) != 17 {
		return form + ", got " + quoteForPath(s)
	}
	lower := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		if i%3 == 2 {
			if c != ':' {
				return form + ", got " + quoteForPath(s)
			}
			continue
		}
		switch {
		case c >= '0' && c <= '9', c >= 'A' && c <= 'F':
		case c >= 'a' && c <= 'f':
			lower = true
		default:
			return form + ", got " + quoteForPath(s)
		}
	}
	if lower {
		return "must be upper case, like AA:BB:CC:DD:EE:FF, got " + quoteForPath(s)
	}
	return ""
}

func uuidV4Rule(s string) string {
	const form = "must be a UUID v4 like 7c9e6679-7425-40de-944b-e07fc1f90ae7 (8-4-4-4-12 hexadecimal digits)"
	if len(s) != 36 {
		return form + ", got " + quoteForPath(s)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return form + ", got " + quoteForPath(s)
			}
			continue
		}
		if !isHex(c) {
			return form + ", got " + quoteForPath(s)
		}
	}
	if s[14] != '4' {
		return fmt.Sprintf("must be a UUID version 4: the version digit (first of the third group) is %q, want '4', got %s", s[14], s)
	}
	switch s[19] {
	case '8', '9', 'a', 'b', 'A', 'B':
	default:
		return fmt.Sprintf("must be a UUID of the RFC 4122 variant: the first digit of the fourth group is %q, want 8, 9, a or b, got %s", s[19], s)
	}
	return ""
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

func batchIDRule(s, hardwareID string) string {
	if len(s) == 0 || len(s) > MaxBatchIDLen {
		return fmt.Sprintf("must be 1 to %d characters long, got %d", MaxBatchIDLen, len(s))
	}
	for i := 0; i < len(s); i++ {
		if !batchIDChar(s[i]) {
			r, _ := utf8.DecodeRuneInString(s[i:])
			return fmt.Sprintf("has %q at byte %d; only A-Z a-z 0-9 _ : . - are allowed", r, i)
		}
	}
	if len(s) <= len(hardwareID) || s[:len(hardwareID)] != hardwareID || s[len(hardwareID)] != '_' {
		return "must start with the hardware_id and '_' (" + hardwareID + "_), got " + quoteForPath(s)
	}
	return ""
}

func batchIDChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		c == '_' || c == ':' || c == '.' || c == '-'
}

func firmwareVersionRule(s string) string {
	if len(s) == 0 || len(s) > MaxFirmwareVersionLen {
		return fmt.Sprintf("must be 1 to %d printable ASCII characters, got %d bytes", MaxFirmwareVersionLen, len(s))
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7E {
			r, _ := utf8.DecodeRuneInString(s[i:])
			return fmt.Sprintf("must be printable ASCII characters (0x20 to 0x7E), has %q at byte %d", r, i)
		}
	}
	return ""
}

func friendlyNameRule(s string) string {
	n := 0
	for i, r := range s {
		if r == utf8.RuneError {
			if _, size := utf8.DecodeRuneInString(s[i:]); size <= 1 {
				return "must be valid UTF-8"
			}
		}
		if !unicode.IsPrint(r) {
			return fmt.Sprintf("must be printable characters, has %q at byte %d", r, i)
		}
		n++
	}
	if n == 0 || n > MaxFriendlyNameLen {
		return fmt.Sprintf("must be 1 to %d characters long, got %d (leave it out to have no name)", MaxFriendlyNameLen, n)
	}
	return ""
}

// nameRule checks a sensor or feature name: ^[a-z0-9_]{1,64}$.
func nameRule(s, what string) string {
	if len(s) == 0 || len(s) > MaxNameLen {
		return fmt.Sprintf("%s must be 1 to %d characters of a-z 0-9 _ (^[a-z0-9_]{1,64}$), got %d", what, MaxNameLen, len(s))
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' {
			continue
		}
		hint := ""
		if c >= 'A' && c <= 'Z' {
			hint = " (names are lower case)"
		}
		r, _ := utf8.DecodeRuneInString(s[i:])
		return fmt.Sprintf("%s may only have a-z 0-9 _ (^[a-z0-9_]{1,64}$), has %q at byte %d%s", what, r, i, hint)
	}
	return ""
}

const numberRangeRule = "must be a finite number that DynamoDB can store: zero, or a magnitude from 1E-130 " +
	"up to 9.9999999999999999999999999999999999999E+125 (as a 64-bit float: below 1E+126)"

func numberRule(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return numberRangeRule
	}
	if a := math.Abs(v); a != 0 && (a < MinNumberMagnitude || a >= NumberMagnitudeLimit) {
		return numberRangeRule + ", got " + strconv.FormatFloat(v, 'g', -1, 64)
	}
	return ""
}
