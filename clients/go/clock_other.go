//go:build !linux

package fencedlock

import "time"

var clockStart = time.Now()

// now reads Go's monotonic clock (time.Since uses it).
func now() instant { return instant(time.Since(clockStart)) }
