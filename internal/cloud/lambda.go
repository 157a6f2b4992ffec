package cloud

import (
	"context"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
)

// NewLambdaClient returns a Lambda client with NewClient's region and
// credential rules: cfg.Endpoint (e.g. the Runtime Interface Emulator's
// URL) becomes the client's BaseEndpoint, with us-east-1 and the static
// "local" credentials when the chain has none. cfg.TablePrefix is not used.
// The SDK makes no retries: the caller owns them. Requests carry no SDK
// telemetry headers (compactHeaders). opts are applied last.
func NewLambdaClient(ctx context.Context, cfg Config, opts ...func(*lambda.Options)) (*lambda.Client, error) {
	awsCfg, err := loadAWS(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return lambda.NewFromConfig(awsCfg, append([]func(*lambda.Options){func(o *lambda.Options) {
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
		}
		o.RetryMaxAttempts = 1
		o.APIOptions = append(o.APIOptions, compactHeaders)
	}}, opts...)...), nil
}
