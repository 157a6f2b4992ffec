package auth

import "time"

// Test hooks for the tests of package auth_test: they read or change
// unexported fields.

// UnknownKeys returns how many unknown key hashes a remembers.
func UnknownKeys(a *Authenticator) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.unknown)
}

// SetAuthClock makes a read the time from now.
func SetAuthClock(a *Authenticator, now func() time.Time) { a.now = now }

// MaxUnknownKeys is maxUnknownKeys.
const MaxUnknownKeys = maxUnknownKeys

// SetDeviceKeysClock makes k read the time from now.
func SetDeviceKeysClock(k *DeviceKeys, now func() time.Time) { k.now = now }
