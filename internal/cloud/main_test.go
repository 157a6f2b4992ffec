package cloud_test

import (
	"testing"

	"greenhouse-gateway/internal/dynamotest"
)

func TestMain(m *testing.M) { dynamotest.Main(m) }
