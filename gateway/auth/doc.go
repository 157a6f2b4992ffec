// Package auth is the gateway's verification of who a device is: it owns
// the API key authenticator (auth.go: lookups in api_keys through a cache
// kept on disk, throttling of unknown keys, last-use writes) and the device
// keys (devicekeys.go: the keys issued here at enrollment or seen, what a
// key may act for under auth.device_keys, resets), with the Principal a
// verified key stands for.
//
// NewAuthenticator and NewDeviceKeys read nothing: Load reads their saved
// records from the buffer's state, once, before they are used. The
// Authenticator's Run writes the keys' last uses to api_keys.
//
// Imports: registry (the key states it reports), internal/cloud and
// firmware-contract. It must not import a transport or the ingest path.
package auth
