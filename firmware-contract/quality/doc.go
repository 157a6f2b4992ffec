// Package quality scores sensor readings: a number in [0, 1] per reading that
// says how far the reading can be trusted, from the plausibility of each value
// for its unit, the device's own sensor_status, and spike and stuck-value checks
// against the device's recent values of the same sensor.
//
// It lives under firmware-contract/ because the score is part of what devices,
// the gateway and the cloud agree on: the cloud function returns it per reading
// and stores it as the optional quality_score attribute of device_readings
// items, the gateway's local readings API shows it, and firmware or cloud
// authors who compute it elsewhere check their code against the vectors in
// firmware-contract/testdata/quality.json. The formula below is the contract;
// firmware-contract/README.md ("Quality score") states it for non-Go readers.
//
// The package does no I/O and holds no state: [Score] is a pure function of a
// reading and the values that came before it. [ScoreSequence] scores a slice in
// order, and [Window] keeps a bounded history per device for callers that
// stream readings; both only feed [Score].
//
// # Formula
//
// A reading's score is the mean of its entries' scores, rounded to three
// decimal places (half away from zero); a reading with no entries scores 1.
// The sum runs over the values in byte order of their names, then over the
// status entries in the same order, so that every implementation rounds the
// same sum. The entries are
//
//   - one per value in sensors, scoring range × spike × stuck × status
//     (each factor in [0, 1], defined below);
//   - one per sensor_status entry other than "ok" that governs no value (a
//     failed sensor whose value the firmware left out, as the contract asks):
//     it scores its status factor, so "error" adds an entry scoring 0.
//
// Status. A sensor_status entry named s governs the value named k when k == s
// or k starts with s + "_" (bme280 governs bme280_temp_c; soil_moisture
// governs soil_moisture_pct); when several govern k, the longest name wins.
// The status factor is 1 for "ok" or when no entry governs the value, 0 for
// "error", and 0.5 for any other status (the contract allows only ok and error;
// 0.5 keeps a future status from scoring like either).
//
// Range. The unit is the name's suffix from the table of [Units] (the longest
// suffix that matches). A value inside [Min, Max] has range factor 1; outside,
// at distance d from the nearer bound, the factor is max(0, 1 - d/margin) with
// LowMargin below Min and HighMargin above Max; a margin of 0 makes any value
// beyond that bound score 0. A value whose name has no known suffix has range,
// spike and stuck factors 1 (the scorer does not judge a unit it does not know),
// and a value that is not finite scores 0.
//
// Spike. h is the last (at most) [HistoryLen] finite recent values of the
// sensor, oldest first. With fewer than [MinSpikeHistory] values, or for a unit
// whose SpikeSpread is 0 (light, irradiance, radio: they jump legitimately),
// the factor is 1. Otherwise, with m the median of h (the mean of the two
// middle values for an even count), mad the median of |x - m| over h,
// scale = max(1.4826 × mad, SpikeSpread) and z = |v - m| / scale:
//
//	spike = 1                          if z <= 6
//	spike = 1 - 0.8 × (z - 6) / 12     if 6 < z < 18
//	spike = 0.2                        if z >= 18
//
// A jump is never scored 0: a door opened or a heater switched on looks the
// same as a glitch from the values alone.
//
// Stuck. n is the number of values at the end of h exactly equal to v (counted
// back from the newest, stopping at the first different one). For a unit with
// Stuck set, the factor is 0.5 when n >= [StuckRun] and 1 otherwise; for other
// units (supply voltage, light at night) it is 1.
//
// Missing history is never a penalty: the first readings of a device, or the
// first ones of a query, have spike and stuck factors 1.
package quality
