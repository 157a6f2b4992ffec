package ingest_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/buffer"
	"greenhouse-gateway/firmware-contract"
	"greenhouse-gateway/harness/gatewaytest"
	"greenhouse-gateway/ingest"
)

// selfSigned writes a certificate for 127.0.0.1 and its key, and returns
// their paths and a pool that trusts the certificate.
func selfSigned(t *testing.T) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "gateway"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	require.NoError(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600))
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

func TestTLSListeners(t *testing.T) {
	certFile, keyFile, pool := selfSigned(t)
	buf, err := buffer.Open(t.TempDir(), buffer.Options{}, nil, nil)
	require.NoError(t, err)
	defer buf.Close()
	reg := prometheus.NewRegistry()
	auth, err := ingest.NewAuthenticator(ingest.AuthConfig{}, ingest.Peppers{Current: gatewaytest.Pepper}, gatewaytest.NewFakeKeys(), buf, nil, reg)
	require.NoError(t, err)
	ing, err := ingest.New(ingest.Config{}, buf, nil, nil, nil, reg)
	require.NoError(t, err)
	broker, err := ingest.NewBroker(ingest.MQTTConfig{Addr: "127.0.0.1:0", TLSCertFile: certFile, TLSKeyFile: keyFile}, ing, auth, nil, reg)
	require.NoError(t, err)
	ingest.SetConnectLimits(broker, 10*time.Second, 1) // one unauthenticated connection at a time
	require.NoError(t, broker.Listen())
	api, err := ingest.NewHTTPServer(ingest.HTTPConfig{Addr: "127.0.0.1:0", TLSCertFile: certFile, TLSKeyFile: keyFile},
		ingest.HTTPDeps{Ingest: ing, Auth: auth, Metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), Ready: func() error { return nil }}, nil)
	require.NoError(t, err)
	require.NoError(t, api.Listen())
	ctx, cancel := gatewaytest.ContextWithCancel()
	defer cancel()
	go func() { _ = broker.Run(ctx) }()
	go func() { _ = api.Run(ctx) }()

	// A TLS connection that sends no CONNECT holds the one place before
	// authentication, and is shed for the device below.
	silent, err := tls.Dial("tcp", broker.Addr(), &tls.Config{RootCAs: pool})
	require.NoError(t, err)
	defer silent.Close()
	require.Eventually(t, func() bool { return gaugeValue(t, reg, unauthenticatedGauge) == 1 }, 10*time.Second, 10*time.Millisecond)

	hw := "AA:BB:CC:DD:EE:30"
	c := paho.NewClient(paho.NewClientOptions().AddBroker("ssl://" + broker.Addr()).SetClientID(hw).
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

	_, err = ingest.NewBroker(ingest.MQTTConfig{TLSCertFile: certFile}, ing, auth, nil, nil)
	require.ErrorContains(t, err, "set both or neither")
	bad, err := ingest.NewBroker(ingest.MQTTConfig{Addr: "127.0.0.1:0", TLSCertFile: keyFile, TLSKeyFile: keyFile}, ing, auth, nil, prometheus.NewRegistry())
	require.NoError(t, err)
	require.True(t, strings.Contains(bad.Listen().Error(), "mqtt TLS"))
}
