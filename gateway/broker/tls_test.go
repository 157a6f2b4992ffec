package broker_test

import (
	"crypto/tls"
	"errors"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/gateway/auth"
	"greenhouse-gateway/gateway/broker"
	"greenhouse-gateway/gateway/httpserve"
	"greenhouse-gateway/gateway/ingest"
	"greenhouse-gateway/harness/gatewaytest"
)

func TestTLSListeners(t *testing.T) {
	certFile, keyFile, pool := gatewaytest.SelfSigned(t)
	buf, err := buffer.Open(t.TempDir(), buffer.Options{}, nil, nil)
	require.NoError(t, err)
	defer buf.Close()
	reg := prometheus.NewRegistry()
	authn, err := auth.NewAuthenticator(auth.AuthConfig{}, auth.Peppers{Current: gatewaytest.Pepper}, gatewaytest.NewFakeKeys(), buf, nil, nil, reg)
	require.NoError(t, err)
	require.NoError(t, authn.Load())
	ing, err := ingest.New(ingest.Config{}, ingest.Deps{Store: buf, Registerer: reg})
	require.NoError(t, err)
	mqttBroker, err := broker.NewBroker(broker.MQTTConfig{Addr: "127.0.0.1:0", TLSCertFile: certFile, TLSKeyFile: keyFile}, ing, authn, nil, reg)
	require.NoError(t, err)
	broker.SetConnectLimits(mqttBroker, 10*time.Second, 1) // one unauthenticated connection at a time
	require.NoError(t, mqttBroker.Listen())
	api, err := httpserve.NewHTTPServer(httpserve.HTTPConfig{Addr: "127.0.0.1:0", TLSCertFile: certFile, TLSKeyFile: keyFile},
		httpserve.HTTPDeps{Ingest: ing, Auth: authn, Metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), Ready: func() error { return nil }}, nil)
	require.NoError(t, err)
	require.NoError(t, api.Listen())
	ctx, cancel := gatewaytest.ContextWithCancel()
	defer cancel()
	go func() { _ = mqttBroker.Run(ctx) }()
	go func() { _ = api.Run(ctx) }()

	// A TLS connection that sends no CONNECT holds the one place before
	// authentication, and is shed for the device below.
	silent, err := tls.Dial("tcp", mqttBroker.Addr(), &tls.Config{RootCAs: pool})
	require.NoError(t, err)
	defer silent.Close()
	require.Eventually(t, func() bool { return gaugeValue(t, reg, unauthenticatedGauge) == 1 }, 10*time.Second, 10*time.Millisecond)

	hw := "AA:BB:CC:DD:EE:30"
	c := paho.NewClient(paho.NewClientOptions().AddBroker("ssl://" + mqttBroker.Addr()).SetClientID(hw).
		SetUsername(hw).SetPassword(gatewaytest.GoodKey).SetTLSConfig(&tls.Config{RootCAs: pool}).SetAutoReconnect(false))
	tok := c.Connect()
	require.True(t, tok.WaitTimeout(20*time.Second))
	require.NoError(t, tok.Error())
	pub := c.Publish(contract.ReadingsTopic(hw), 1, false, gatewaytest.BatchJSON(hw, gatewaytest.NewBoot(), 0, 1))
	require.True(t, pub.WaitTimeout(20*time.Second))
	require.NoError(t, pub.Error())
	c.Disconnect(10)
	_ = silent.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = silent.Read(make([]byte, 1))
	require.Error(t, err)
	require.False(t, errors.Is(err, os.ErrDeadlineExceeded), "the silent connection was shed: %v", err)
	require.Zero(t, gaugeValue(t, reg, unauthenticatedGauge), "the device left the admission once authenticated")

	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	resp, err := client.Get("https://" + api.Addr() + "/healthz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	plain, err := http.Get("http://" + api.Addr() + "/healthz")
	require.NoError(t, err)
	plain.Body.Close()
	require.Equal(t, http.StatusBadRequest, plain.StatusCode, "plain HTTP is refused on a TLS listener")
	require.EqualValues(t, 1, buf.Stats().PendingBatches)

	_, err = broker.NewBroker(broker.MQTTConfig{TLSCertFile: certFile}, ing, authn, nil, nil)
	require.ErrorContains(t, err, "set both or neither")
	bad, err := broker.NewBroker(broker.MQTTConfig{Addr: "127.0.0.1:0", TLSCertFile: keyFile, TLSKeyFile: keyFile}, ing, authn, nil, prometheus.NewRegistry())
	require.NoError(t, err)
	require.True(t, strings.Contains(bad.Listen().Error(), "mqtt TLS"))
}
