// Package byterelay counts what a client puts on its link to one server,
// from outside the client: a TCP relay on 127.0.0.1 that passes every
// connection to its target and counts the bytes crossing it each way, the
// connections it relayed and the HTTP/1.x requests in the clients' streams.
package byterelay
