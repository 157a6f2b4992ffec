package buffer

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// memTableSizeFor returns the memtable size to open dir with: configured,
// or larger when a write-ahead log left by a crash was written with a
// larger memtable. Badger replays each log (.mem) into a skiplist arena
// sized for the configured memtable and panics ("Arena too small") when
// the log holds more, so lowering buffer.memtable_size, or its default,
// must not apply before those logs are flushed. Badger creates every log
// at twice the memtable size, so the log's file size tells which size
// wrote it. After a clean close no log holds data, and the configured
// size applies from the next start.
func memTableSizeFor(dir string, configured int64) (int64, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		if os.IsNotExist(err) {
			return configured, nil
		}
		return 0, fmt.Errorf("reading %s: %w", dir, err)
	}
	size := configured
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".mem") {
			continue
		}
		info, err := e.Info()
		if err != nil {
			return 0, fmt.Errorf("reading %s: %w", filepath.Join(dir, e.Name()), err)
		}
		size = max(size, info.Size()/2)
	}
	return size, nil
}
