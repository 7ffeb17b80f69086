package fencedlock

import (
	"syscall"
	"time"
	"unsafe"
)

const clockBoottime = 7 // CLOCK_BOOTTIME, <linux/time.h>

var bootFallback = time.Now()

func now() instant {
	var ts syscall.Timespec
	_, _, errno := syscall.RawSyscall(syscall.SYS_CLOCK_GETTIME, clockBoottime, uintptr(unsafe.Pointer(&ts)), 0)
	if errno != 0 { // kernels before 2.6.39: Go's monotonic clock
		return instant(time.Since(bootFallback))
	}
	return instant(time.Duration(ts.Sec)*time.Second + time.Duration(ts.Nsec))
}
