package clock

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/stretchr/testify/require"
)

func TestObserveLearnsTheOffset(t *testing.T) {
	// A Pi that booted without NTP believes it is 1970.
	sys := time.Date(1970, 1, 1, 0, 1, 0, 0, time.UTC)
	c := New(time.Time{}, nil)
	c.system = func() time.Time { return sys }
	require.False(t, c.Plausible())
	require.False(t, c.Learned())

	server := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	c.Observe(server, sys.Add(-100*time.Millisecond), sys.Add(100*time.Millisecond))
	require.True(t, c.Learned())
	require.True(t, c.Plausible())
	require.WithinDuration(t, server, c.Now(), time.Second)

	// NTP syncs later: the system clock is right, the correction goes.
	sys = server.Add(time.Minute)
	c.Observe(server.Add(time.Minute), sys, sys.Add(300*time.Millisecond))
	require.Zero(t, c.Offset())
	require.Equal(t, sys, c.Now())
}

func TestSmallDifferencesAreNoise(t *testing.T) {
	now := time.Date(2026, 11, 22, 10, 0, 0, 700_000_000, time.UTC)
	c := New(time.Time{}, nil)
	c.system = func() time.Time { return now }
	c.Observe(now.Truncate(time.Second), now, now) // header truncated to the second
	require.Zero(t, c.Offset())
	c.Observe(now.Add(-90*time.Second).Truncate(time.Second), now, now)
	require.Equal(t, -90*time.Second, c.Offset(), "a clock 90 s fast is corrected")
}

// TestLearnsFromDynamoDBAnswers runs the SDK against a server that answers
// as DynamoDB does, with a Date header 3 hours ahead of this machine.
// (DynamoDB Local sends no Date header, so it cannot serve here.)
func TestLearnsFromDynamoDBAnswers(t *testing.T) {
	ahead := 3 * time.Hour
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Date", time.Now().Add(ahead).UTC().Format(http.TimeFormat))
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		_, _ = w.Write([]byte(`{"TableNames":[]}`))
	}))
	defer srv.Close()
	c := New(time.Time{}, nil)
	client := dynamodb.New(dynamodb.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(srv.URL),
		Credentials: credentials.NewStaticCredentialsProvider("k", "s", ""),
	}, c.DynamoDBOption())
	_, err := client.ListTables(context.Background(), &dynamodb.ListTablesInput{})
	require.NoError(t, err)
	require.True(t, c.Learned())
	require.InDelta(t, ahead.Seconds(), c.Offset().Seconds(), 2)
	require.WithinDuration(t, time.Now().Add(ahead), c.Now(), 2*time.Second)
}
