// Package logpace paces the log lines of floods: it owns the counting of
// refusals by reason between two lines, so that the broker, the HTTP
// listener and the ingest path report a flood in one line a minute instead
// of a line per event.
package logpace
