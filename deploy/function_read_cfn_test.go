package deploy_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"greenhouse-gateway/function"
)

// compareRouteAuthorization checks that the HTTP API gives every read route
// (function.ReadRoutes) AWS_IAM authorization and the device routes none
// (devices authenticate with their API keys, in the function).
func compareRouteAuthorization(tmpl *template) error {
	var errs []error
	for _, id := range tmpl.resourcesOfType("AWS::ApiGatewayV2::Route") {
		props, err := tmpl.properties(id)
		if err != nil {
			return err
		}
		key, auth := fmt.Sprint(props["RouteKey"]), props["AuthorizationType"]
		switch read := slices.Contains(function.ReadRoutes, key); {
		case read && auth != "AWS_IAM":
			errs = append(errs, fmt.Errorf("route %s (%s): a read route needs AuthorizationType AWS_IAM, has %v", id, key, auth))
		case !read && auth != nil && auth != "NONE":
			errs = append(errs, fmt.Errorf("route %s (%s): a device route takes no API Gateway authorization, has %v", id, key, auth))
		}
	}
	return errors.Join(errs...)
}

func TestReadRoutesNeedIAMAuthorization(t *testing.T) {
	tmpl, err := parseFunctionTemplate(readFile(t, functionTemplatePath))
	require.NoError(t, err)
	require.NoError(t, compareRouteAuthorization(tmpl))

	var root yaml.Node
	require.NoError(t, yaml.Unmarshal(readFile(t, functionTemplatePath), &root))
	at(t, &root, "Resources", "DeviceReadingsRoute", "Properties", "AuthorizationType").Value = "NONE"
	src, err := yaml.Marshal(&root)
	require.NoError(t, err)
	tmpl, err = parseFunctionTemplate(src)
	require.NoError(t, err)
	err = compareRouteAuthorization(tmpl)
	require.Error(t, err, "a read route without AWS_IAM is caught")
	require.True(t, strings.Contains(err.Error(), "DeviceReadingsRoute"), err.Error())
}
