package cloud

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/smithy-go/logging"
)

const (
	// localRegion is used with an explicit endpoint when the SDK chain has no region.
	localRegion = "us-east-1"
	// localAccessKey is the static access key id and secret used with an explicit endpoint
	// when the SDK chain has no credentials. DynamoDB Local accepts any credentials.
	localAccessKey = "local"
	// credentialProbeTimeout bounds the credential check done when an endpoint is set
	// (the chain may end in an IMDS lookup, which is slow on hosts without IMDS).
	credentialProbeTimeout = 5 * time.Second
)

// NewClient returns a DynamoDB client for cfg.
//
// Region and credentials come from the SDK's default chain (config.LoadDefaultConfig); a
// non-empty cfg.Region overrides the chain's region. When cfg.Endpoint is set it becomes the
// client's BaseEndpoint, and, so that DynamoDB Local works without any AWS setup, the region
// defaults to us-east-1 and the credentials to the static pair "local"/"local" when the chain
// finds none. With an endpoint set, response CRC32 validation is also turned off: DynamoDB
// Local sends no X-Amz-Crc32 header on error responses and the SDK would otherwise log a
// checksum warning for every one of them (TLS still protects the body in transit); and the
// SDK's "falling back to IMDSv1" warning, a side effect of looking for credentials on hosts
// whose metadata address answers 403, is dropped. Other SDK warnings still go to stderr.
//
// The HTTP client is the SDK's buildable client, which honours AWS_CA_BUNDLE (a plain
// *http.Client makes LoadDefaultConfig fail when AWS_CA_BUNDLE is set).
//
// BatchWriteItem bodies are encoded by the package's own encoder
// (batchWriteProtocol), the same JSON with one allocation; requests carry
// no SDK telemetry headers (compactHeaders).
//
// Retries are the SDK's standard ones unless opts change them, e.g. with
// WithRetryMaxAttempts; opts are applied last, so they win.
func NewClient(ctx context.Context, cfg Config, opts ...func(*dynamodb.Options)) (*dynamodb.Client, error) {
	awsCfg, err := loadAWS(ctx, cfg)
	if err != nil {
		return nil, err
	}
	clientOpts := []func(*dynamodb.Options){withBatchWriteEncoder, func(o *dynamodb.Options) {
		o.APIOptions = append(o.APIOptions, compactHeaders)
	}}
	if cfg.Endpoint != "" {
		endpoint := cfg.Endpoint
		clientOpts = append(clientOpts, func(o *dynamodb.Options) {
			o.BaseEndpoint = aws.String(endpoint)
			o.DisableValidateResponseChecksum = true
		})
	}
	clientOpts = append(clientOpts, opts...)
	return dynamodb.NewFromConfig(awsCfg, clientOpts...), nil
}

// loadAWS validates cfg and loads the SDK configuration NewClient
// describes: the default chain, cfg.Region over the chain's region, and,
// with cfg.Endpoint set, us-east-1 and the static "local" credentials
// when the chain has none.
func loadAWS(ctx context.Context, cfg Config) (aws.Config, error) {
	if err := cfg.Validate(); err != nil {
		return aws.Config{}, fmt.Errorf("dynamodb config: %w", err)
	}
	loadOpts := []func(*config.LoadOptions) error{
		config.WithHTTPClient(awshttp.NewBuildableClient()),
	}
	if cfg.Region != "" {
		loadOpts = append(loadOpts, config.WithRegion(cfg.Region))
	}
	if cfg.Endpoint != "" {
		loadOpts = append(loadOpts, config.WithLogger(quietIMDSLogger{next: logging.NewStandardLogger(os.Stderr)}))
	}
	awsCfg, err := config.LoadDefaultConfig(ctx, loadOpts...)
	if err != nil {
		return aws.Config{}, fmt.Errorf("loading aws config: %w", err)
	}
	if cfg.Endpoint == "" {
		if awsCfg.Region == "" {
			return aws.Config{}, errors.New("no aws region: set the region option or AWS_REGION")
		}
		return awsCfg, nil
	}
	if awsCfg.Region == "" {
		awsCfg.Region = localRegion
	}
	if !haveCredentials(ctx, awsCfg.Credentials) {
		awsCfg.Credentials = credentials.NewStaticCredentialsProvider(localAccessKey, localAccessKey, "")
	}
	return awsCfg, nil
}

// WithRetryMaxAttempts returns a client option that sets the SDK's maximum number of
// attempts per call (1 means no retry). Callers that own a longer retry horizon, such as
// the uplink, use a small value so a failing call returns promptly. Zero keeps the SDK
// default (3 attempts).
func WithRetryMaxAttempts(n int) func(*dynamodb.Options) {
	return func(o *dynamodb.Options) {
		o.RetryMaxAttempts = n
	}
}

// WithConnections lets the client keep up to n idle connections to its
// endpoint (the SDK keeps 10), so that n requests in flight keep reusing
// their connections instead of closing all but 10 whenever they finish
// together and opening new ones (with a TLS handshake each, on AWS) for
// the next burst. It keeps the SDK client's other transport settings
// (AWS_CA_BUNDLE, timeouts).
func WithConnections(n int) func(*dynamodb.Options) {
	return func(o *dynamodb.Options) {
		if c, ok := o.HTTPClient.(*awshttp.BuildableClient); ok {
			o.HTTPClient = c.WithTransportOptions(func(tr *http.Transport) {
				tr.MaxIdleConnsPerHost = max(tr.MaxIdleConnsPerHost, n)
				tr.MaxIdleConns = max(tr.MaxIdleConns, n)
			})
		}
	}
}

// quietIMDSLogger is the SDK's standard logger without the IMDSv1 fallback warning.
type quietIMDSLogger struct {
	next logging.Logger
}

func (l quietIMDSLogger) Logf(c logging.Classification, format string, v ...any) {
	if strings.HasPrefix(format, "falling back to IMDSv1") {
		return
	}
	l.next.Logf(c, format, v...)
}

// haveCredentials reports whether provider yields credentials within credentialProbeTimeout.
func haveCredentials(ctx context.Context, provider aws.CredentialsProvider) bool {
	if provider == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, credentialProbeTimeout)
	defer cancel()
	creds, err := provider.Retrieve(ctx)
	return err == nil && creds.HasKeys()
}
