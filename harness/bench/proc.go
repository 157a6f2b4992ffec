//go:build linux

package bench

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTick is the kernel's USER_HZ, the unit of utime and stime in
// /proc/PID/stat; it is 100 on every Linux architecture Go supports.
const clockTick = 100

// procCPU returns the CPU time (user + system) a process has used.
func procCPU(pid int) (time.Duration, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces; fields after it are
	// plain numbers. utime and stime are fields 14 and 15.
	end := bytes.LastIndexByte(raw, ')')
	if end < 0 {
		return 0, fmt.Errorf("parsing /proc/%d/stat: no ')'", pid)
	}
	fields := strings.Fields(string(raw[end+1:]))
	if len(fields) < 13 {
		return 0, fmt.Errorf("parsing /proc/%d/stat: %d fields", pid, len(fields))
	}
	utime, err1 := strconv.ParseInt(fields[11], 10, 64)
	stime, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("parsing /proc/%d/stat: %w", pid, err)
	}
	return time.Duration(utime+stime) * time.Second / clockTick, nil
}

// memory is a process's resident set, from /proc/PID/status.
type memory struct {
	RSS int64 `json:"vm_rss_bytes"` // VmRSS: resident now
	HWM int64 `json:"vm_hwm_bytes"` // VmHWM: peak resident
	// RSS splits into anonymous memory (the Go heap, Badger's arenas) and
	// mapped files (Badger's memtable logs, tables and value log).
	Anon int64 `json:"rss_anon_bytes"`
	File int64 `json:"rss_file_bytes"`
}

func procMemory(pid int) (memory, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return memory{}, err
	}
	defer f.Close()
	var m memory
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		var field *int64
		switch name {
		case "VmRSS":
			field = &m.RSS
		case "VmHWM":
			field = &m.HWM
		case "RssAnon":
			field = &m.Anon
		case "RssFile":
			field = &m.File
		}
		if !ok || field == nil {
			continue
		}
		fields := strings.Fields(rest) // "12345 kB"
		if len(fields) != 2 || fields[1] != "kB" {
			return memory{}, fmt.Errorf("parsing /proc/%d/status: %q", pid, sc.Text())
		}
		kb, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			return memory{}, fmt.Errorf("parsing /proc/%d/status: %w", pid, err)
		}
		*field = kb << 10
	}
	if err := sc.Err(); err != nil {
		return memory{}, err
	}
	return m, nil
}

// diskUsage is the space a directory tree takes.
type diskUsage struct {
	// Allocated counts the blocks allocated to files, as du does; sparse
	// preallocated files (Badger's memtable logs) count what is written.
	Allocated int64 `json:"allocated_bytes"`
	// Apparent is the sum of file sizes (du --apparent-size).
	Apparent int64 `json:"apparent_bytes"`
}

func dirUsage(dir string) (diskUsage, error) {
	var u diskUsage
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			u.Allocated += st.Blocks * 512
		}
		if info.Mode().IsRegular() {
			u.Apparent += info.Size()
		}
		return nil
	})
	return u, err
}

// copyDir copies the regular files of a directory tree.
func copyDir(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o750)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(target, data, 0o640)
	})
}

// tailFile returns the last n bytes of a file, for error messages.
func tailFile(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > n {
		_, _ = f.Seek(st.Size()-n, 0)
	}
	var b bytes.Buffer
	_, _ = b.ReadFrom(f)
	return b.String()
}
