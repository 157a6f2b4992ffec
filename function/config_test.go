package function_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/function"
)

func envOf(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestConfigFromEnvDefaultsAndErrors(t *testing.T) {
	c, err := function.ConfigFromEnv(envOf(map[string]string{"API_KEY_PEPPER": "p", "TABLE_PREFIX": "prod_"}))
	require.NoError(t, err)
	require.Equal(t, "prod_device_readings", c.Tables.Readings)
	require.Equal(t, int64(1<<20), c.MaxBodyBytes)
	require.Equal(t, "accept_older", c.Ordering)
	require.Equal(t, 5*time.Minute, c.OrderingGrace)
	require.Equal(t, 0, c.TransactionMaxItems, "probed")
	require.Equal(t, 24*time.Hour, c.IdempotencyTTL)

	for _, tt := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{}, "API_KEY_PEPPER: must be set"},
		{map[string]string{"API_KEY_PEPPER": "p", "ORDERING": "newest"}, `ORDERING: "newest" is not one of accept_older, reject_older`},
		{map[string]string{"API_KEY_PEPPER": "p", "MAX_BODY_BYTES": "-1"}, `MAX_BODY_BYTES: "-1" must be a positive integer`},
		{map[string]string{"API_KEY_PEPPER": "p", "ORDERING_GRACE": "5"}, `ORDERING_GRACE: "5" must be a duration`},
		{map[string]string{"API_KEY_PEPPER": "p", "TRANSACTION_MAX_ITEMS": "101"}, "TRANSACTION_MAX_ITEMS: 101 must be between 2 and 100"},
		{map[string]string{"API_KEY_PEPPER": "p", "TRANSACTION_MAX_ITEMS": "1"}, "TRANSACTION_MAX_ITEMS: 1 must be between 2 and 100"},
	} {
		_, err := function.ConfigFromEnv(envOf(tt.env))
		require.ErrorContains(t, err, tt.want)
	}
}
