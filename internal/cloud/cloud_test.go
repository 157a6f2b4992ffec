package cloud_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"greenhouse-gateway/internal/cloud"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		cfg     cloud.Config
		wantErr string
	}{
		{name: "zero value", cfg: cloud.Config{}},
		{name: "local", cfg: cloud.Config{Endpoint: "http://127.0.0.1:8000", Region: "us-east-1", TablePrefix: "dev_"}},
		{name: "https endpoint", cfg: cloud.Config{Endpoint: "https://dynamodb.eu-west-1.amazonaws.com"}},
		{name: "prefix with dot and dash", cfg: cloud.Config{TablePrefix: "green.house-1_"}},
		{name: "relative endpoint", cfg: cloud.Config{Endpoint: "127.0.0.1:8000"}, wantErr: "absolute http or https URL"},
		{name: "ftp endpoint", cfg: cloud.Config{Endpoint: "ftp://example.com"}, wantErr: "absolute http or https URL"},
		{name: "bad region", cfg: cloud.Config{Region: "us east"}, wantErr: "region"},
		{name: "bad prefix", cfg: cloud.Config{TablePrefix: "green/house"}, wantErr: "table_prefix"},
		{name: "prefix too long", cfg: cloud.Config{TablePrefix: strings.Repeat("p", 239)}, wantErr: "DynamoDB allows 255"},
		{name: "longest prefix", cfg: cloud.Config{TablePrefix: strings.Repeat("p", 238)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
}

func TestTableNames(t *testing.T) {
	tests := []struct {
		name   string
		prefix string
		want   cloud.Tables
	}{
		{name: "no prefix", want: cloud.Tables{
			Devices: "devices", Readings: "device_readings", ProcessedBatches: "processed_batches", APIKeys: "api_keys",
		}},
		{name: "verbatim prefix", prefix: "Prod.", want: cloud.Tables{
			Devices: "Prod.devices", Readings: "Prod.device_readings", ProcessedBatches: "Prod.processed_batches", APIKeys: "Prod.api_keys",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, cloud.TableNames(tt.prefix))
		})
	}
}

func TestTTLAttributes(t *testing.T) {
	require.Equal(t, map[string]string{
		"x_device_readings":   "expiration_time",
		"x_processed_batches": "expiration_time",
	}, cloud.TTLAttributes(cloud.TableNames("x_")))
}

func TestHashKey(t *testing.T) {
	tests := []struct {
		name, pepper, raw, want string
	}{
		// printf 'pepperkey' | sha256sum
		{name: "pepper then key", pepper: "pepper", raw: "key", want: "aabace63be9665dab147e43ba199aaceab358e3bb7abe25b418685a681c46dbf"},
		// printf '' | sha256sum
		{name: "empty", want: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
		{name: "concatenation only", pepper: "pepp", raw: "erkey", want: "aabace63be9665dab147e43ba199aaceab358e3bb7abe25b418685a681c46dbf"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, cloud.HashKey(tt.pepper, tt.raw))
		})
	}
}

func TestFormatTime(t *testing.T) {
	loc := time.FixedZone("CET", 3600)
	require.Equal(t, "2024-01-15T10:30:00Z", cloud.FormatTime(time.Date(2024, 1, 15, 11, 30, 0, 999_000_000, loc)))
}

func TestLoadPepper(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
		return p
	}
	tests := []struct {
		name    string
		env     string
		file    string
		want    string
		wantErr []string
	}{
		{name: "env only", env: "from-env", want: "from-env"},
		{name: "file wins over env", env: "from-env", file: write("a", "from-file"), want: "from-file"},
		{name: "trailing newline trimmed", file: write("b", "s3cret\n"), want: "s3cret"},
		{name: "trailing crlf trimmed", file: write("c", "s3cret\r\n"), want: "s3cret"},
		{name: "inner whitespace kept", file: write("d", " s3 cret \n"), want: " s3 cret "},
		{name: "both empty", wantErr: []string{"GATEWAY_API_KEY_PEPPER", "--api-key-pepper-file"}},
		{name: "empty file", env: "from-env", file: write("e", "\n"), wantErr: []string{"empty"}},
		{name: "missing file", env: "from-env", file: filepath.Join(dir, "missing"), wantErr: []string{"pepper file", "missing"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := cloud.LoadPepper(tt.env, tt.file)
			if len(tt.wantErr) > 0 {
				for _, w := range tt.wantErr {
					require.ErrorContains(t, err, w)
				}
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

// isolateAWSEnv makes the SDK chain see no region, no credentials and no IMDS.
func isolateAWSEnv(t *testing.T) {
	t.Helper()
	dir := t.TempDir()
	for k, v := range map[string]string{
		"AWS_CONFIG_FILE":                        filepath.Join(dir, "config"),
		"AWS_SHARED_CREDENTIALS_FILE":            filepath.Join(dir, "credentials"),
		"AWS_EC2_METADATA_DISABLED":              "true",
		"AWS_REGION":                             "",
		"AWS_DEFAULT_REGION":                     "",
		"AWS_PROFILE":                            "",
		"AWS_ACCESS_KEY_ID":                      "",
		"AWS_SECRET_ACCESS_KEY":                  "",
		"AWS_SESSION_TOKEN":                      "",
		"AWS_WEB_IDENTITY_TOKEN_FILE":            "",
		"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": "",
		"AWS_CONTAINER_CREDENTIALS_FULL_URI":     "",
	} {
		t.Setenv(k, v)
	}
}

func TestNewClient(t *testing.T) {
	tests := []struct {
		name       string
		env        map[string]string
		cfg        cloud.Config
		wantRegion string
		wantKey    string
		wantErr    string
	}{
		{
			name:       "endpoint without region or credentials",
			cfg:        cloud.Config{Endpoint: "http://127.0.0.1:1"},
			wantRegion: "us-east-1",
			wantKey:    "local",
		},
		{
			name:       "endpoint keeps chain credentials and region",
			env:        map[string]string{"AWS_ACCESS_KEY_ID": "AKIDCHAIN", "AWS_SECRET_ACCESS_KEY": "s", "AWS_REGION": "eu-west-1"},
			cfg:        cloud.Config{Endpoint: "http://127.0.0.1:1"},
			wantRegion: "eu-west-1",
			wantKey:    "AKIDCHAIN",
		},
		{
			name:       "config region wins over chain",
			env:        map[string]string{"AWS_REGION": "eu-west-1"},
			cfg:        cloud.Config{Endpoint: "http://127.0.0.1:1", Region: "eu-central-1"},
			wantRegion: "eu-central-1",
			wantKey:    "local",
		},
		{
			name:    "aws without region",
			cfg:     cloud.Config{},
			wantErr: "no aws region",
		},
		{
			name:    "invalid config",
			cfg:     cloud.Config{Endpoint: "nope"},
			wantErr: "absolute http or https URL",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			isolateAWSEnv(t)
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			client, err := cloud.NewClient(context.Background(), tt.cfg)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			o := client.Options()
			require.Equal(t, tt.wantRegion, o.Region)
			require.Equal(t, tt.cfg.Endpoint, *o.BaseEndpoint)
			creds, err := o.Credentials.Retrieve(context.Background())
			require.NoError(t, err)
			require.Equal(t, tt.wantKey, creds.AccessKeyID)
		})
	}
}

func TestNewClientRetryOption(t *testing.T) {
	isolateAWSEnv(t)
	client, err := cloud.NewClient(context.Background(), cloud.Config{Endpoint: "http://127.0.0.1:1"},
		cloud.WithRetryMaxAttempts(1))
	require.NoError(t, err)
	require.Equal(t, 1, client.Options().RetryMaxAttempts)

	client, err = cloud.NewClient(context.Background(), cloud.Config{Endpoint: "http://127.0.0.1:1"})
	require.NoError(t, err)
	require.Equal(t, 0, client.Options().RetryMaxAttempts, "SDK default")
}

// TestNewClientCABundle guards the buildable HTTP client: with a plain *http.Client the SDK
// refuses AWS_CA_BUNDLE ("HTTPClient's transport unsupported type").
func TestNewClientCABundle(t *testing.T) {
	isolateAWSEnv(t)
	t.Setenv("AWS_CA_BUNDLE", writeTestCA(t))
	_, err := cloud.NewClient(context.Background(), cloud.Config{Endpoint: "https://127.0.0.1:1"})
	require.NoError(t, err)
}

func writeTestCA(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "cloud test ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	p := filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	return p
}
