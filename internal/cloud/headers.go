package cloud

import (
	"context"

	"github.com/aws/smithy-go/middleware"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// userAgent is the User-Agent of every request to AWS: what CloudTrail
// shows as the caller.
const userAgent = "greenhouse-gateway"

// compactHeaders is an API option that drops, from every request, the
// SDK's telemetry headers, which AWS does not need, and shortens its
// User-Agent: Amz-Sdk-Invocation-Id (a UUID a call), Amz-Sdk-Request (the
// attempt and the retry limit) and "aws-sdk-go-v2/… os/… lang/… md/… api/…
// m/…" for userAgent. It runs just before the request is signed, so the
// dropped headers leave the signature's SignedHeaders too: about 230 bytes
// a request, which a metered link pays on every one.
func compactHeaders(stack *middleware.Stack) error {
	return stack.Finalize.Insert(middleware.FinalizeMiddlewareFunc("GatewayCompactHeaders",
		func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
			if req, ok := in.Request.(*smithyhttp.Request); ok {
				req.Header.Del("Amz-Sdk-Invocation-Id")
				req.Header.Del("Amz-Sdk-Request")
				req.Header.Set("User-Agent", userAgent)
			}
			return next.HandleFinalize(ctx, in)
		}), "Signing", middleware.Before)
}
