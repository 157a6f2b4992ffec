// Package modroot finds the root directory of the greenhouse-gateway
// module, from which the harness runs deploy/ scripts and builds the
// daemons. It imports nothing of the module.
package modroot

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// modulePath is the module whose go.mod marks the root.
const modulePath = "greenhouse-gateway"

// Find walks up from the working directory to the go.mod of module
// greenhouse-gateway, passing over the go.mod of any other module.
func Find() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("finding the module root: %w", err)
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if raw, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil &&
			strings.HasPrefix(string(raw), "module "+modulePath+"\n") {
			return dir, nil
		}
		if filepath.Dir(dir) == dir {
			return "", fmt.Errorf("finding the module root: no go.mod of %s above %s", modulePath, wd)
		}
	}
}
