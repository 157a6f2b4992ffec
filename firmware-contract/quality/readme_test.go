package quality

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestReadmeUnitTable keeps the unit table of firmware-contract/README.md
// (section "Quality score") equal to Units.
func TestReadmeUnitTable(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "README.md"))
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(data), "\n## Quality score\n")
	require.True(t, ok, "README has a Quality score section")
	section, _, _ = strings.Cut(section, "\n## ")
	row := regexp.MustCompile("(?m)^\\| `(_[a-z0-9_]+)` \\| [^|]+ \\| (\\S+) \\.\\. (\\S+) \\| (\\S+) / (\\S+)[^|]* \\| (\\S+) \\| (yes|no) \\|$")
	got := map[string]string{}
	for _, m := range row.FindAllStringSubmatch(section, -1) {
		got[m[1]] = strings.Join(m[2:], " ")
	}
	want := map[string]string{}
	for _, u := range Units() {
		spread, stuck := "off", "no"
		if u.SpikeSpread > 0 {
			spread = fmt.Sprint(u.SpikeSpread)
		}
		if u.Stuck {
			stuck = "yes"
		}
		want[u.Suffix] = fmt.Sprint(u.Min, " ", u.Max, " ", u.LowMargin, " ", u.HighMargin, " ", spread, " ", stuck)
	}
	require.Equal(t, want, got)
}
