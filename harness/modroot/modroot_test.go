package modroot

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestFind(t *testing.T) {
	root, err := Find()
	require.NoError(t, err)
	require.FileExists(t, filepath.Join(root, "go.mod"))
	require.FileExists(t, filepath.Join(root, "deploy", "local", "dynamodb-local.sh"))
}

func TestFindPassesOverOtherModules(t *testing.T) {
	root, err := Find()
	require.NoError(t, err)
	t.Chdir(filepath.Join(root, "third_party", "badger"))
	_, err = os.Stat("go.mod")
	require.NoError(t, err, "third_party/badger is a module of its own")
	got, err := Find()
	require.NoError(t, err)
	require.Equal(t, root, got)
}

func TestFindOutsideTheModule(t *testing.T) {
	t.Chdir(t.TempDir())
	_, err := Find()
	require.ErrorContains(t, err, "no go.mod of greenhouse-gateway above")
}
