package function_test

import (
	"testing"

	"greenhouse-gateway/harness/dynamotest"
)

func TestMain(m *testing.M) { dynamotest.Main(m) }
