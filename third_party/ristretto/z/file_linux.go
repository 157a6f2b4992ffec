/*
 * SPDX-FileCopyrightText: © Hypermode Inc. <hello@hypermode.com>
 * SPDX-License-Identifier: Apache-2.0
 */

package z

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Truncate would truncate the mmapped file to the given size. On Linux, we truncate
// the underlying file and then call mremap, but on other systems, we unmap first,
// then truncate, then re-map.
func (m *MmapFile) Truncate(maxSz int64) error {
	if err := m.Sync(); err != nil {
		return fmt.Errorf("while sync file: %s, error: %v\n", m.Fd.Name(), err)
	}
	if cur := int64(len(m.Data)); maxSz > cur {
		// Growing: allocate the new blocks (see allocate).
		if err := allocate(m.Fd, cur, maxSz); err != nil {
			return fmt.Errorf("while allocating file: %s, error: %w", m.Fd.Name(), err)
		}
	} else if err := m.Fd.Truncate(maxSz); err != nil {
		return fmt.Errorf("while truncate file: %s, error: %v\n", m.Fd.Name(), err)
	}

	var err error
	m.Data, err = mremap(m.Data, int(maxSz)) // Mmap up to max size.
	return err
}

// allocate grows fd to size bytes with the blocks from off allocated
// (fallocate), so that writing them through a shared mapping cannot fail:
// a file system out of space answers ENOSPC here instead of a SIGBUS later.
// File systems without fallocate get the sparse file of ftruncate.
func allocate(fd *os.File, off, size int64) error {
	for {
		err := unix.Fallocate(int(fd.Fd()), 0, off, size-off)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EOPNOTSUPP), errors.Is(err, unix.ENOSYS):
			return fd.Truncate(size)
		default:
			return &os.PathError{Op: "fallocate", Path: fd.Name(), Err: err}
		}
	}
}
