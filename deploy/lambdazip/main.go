// Command lambdazip writes a Lambda deployment zip holding one executable
// at its root: go run ./deploy/lambdazip OUT.zip BOOTSTRAP. The entry is
// named bootstrap (runtime provided.al2023), mode 0755, with a fixed time,
// so the same binary gives the same zip (make lambda).
package main

import (
	"archive/zip"
	"fmt"
	"io"
	"os"
	"time"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: lambdazip OUT.zip BOOTSTRAP")
		os.Exit(2)
	}
	if err := write(os.Args[1], os.Args[2]); err != nil {
		fmt.Fprintln(os.Stderr, "lambdazip:", err)
		os.Exit(1)
	}
}

func write(out, bootstrap string) error {
	src, err := os.Open(bootstrap)
	if err != nil {
		return err
	}
	defer src.Close()
	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	zw := zip.NewWriter(f)
	h := &zip.FileHeader{Name: "bootstrap", Method: zip.Deflate, Modified: time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)}
	h.SetMode(0o755)
	w, err := zw.CreateHeader(h)
	if err == nil {
		_, err = io.Copy(w, src)
	}
	if err == nil {
		err = zw.Close()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing %s: %w", out, err)
	}
	return os.Rename(tmp, out)
}
