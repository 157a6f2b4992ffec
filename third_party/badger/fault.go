/*
 * greenhouse-gateway: see third_party/README.md.
 * SPDX-License-Identifier: Apache-2.0
 */

package badger

import (
	"fmt"
	"runtime/debug"
)

// faultError turns the value of a panic from a memory fault (with
// debug.SetPanicOnFault, a write to a mapped page the kernel refuses) into
// an error; nil stays nil, and any other panic goes on.
func faultError(r any) error {
	if r == nil {
		return nil
	}
	if f, ok := r.(interface{ Addr() uintptr }); ok {
		return fmt.Errorf("fault writing a mapped file at %#x: the disk refused the write (read-only, or failing)",
			f.Addr())
	}
	panic(r)
}

// guardFault runs f with faults on mapped memory returned as errors.
func guardFault(f func() error) (err error) {
	defer func() {
		if ferr := faultError(recover()); ferr != nil {
			err = ferr
		}
	}()
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	return f()
}
