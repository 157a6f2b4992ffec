// Package listen binds the gateway's device-facing TCP listeners: it owns
// the listen options (Linux's TCP_DEFER_ACCEPT) that keep silent sockets in
// the kernel, shared by the embedded broker and the HTTP listener.
package listen
