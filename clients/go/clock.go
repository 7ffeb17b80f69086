package fencedlock

import "time"

// instant is a reading of the client's lease clock: monotonic, and on Linux
// counting the time the machine was suspended too (CLOCK_BOOTTIME), so that
// a lease's deadline keeps passing while a VM or laptop sleeps, as the
// server's clock does. Go's own monotonic clock stops during a suspend.
type instant time.Duration

// sliceWait bounds every sleep of the keepalive: the runtime's timers run on
// the monotonic clock, which stops during a suspend, so the keepalive wakes
// at least this often to look at the lease clock and signals a loss within
// a second of the machine resuming.
const sliceWait = time.Second

func (t instant) add(d time.Duration) instant { return t + instant(d) }

func (t instant) sub(u instant) time.Duration { return time.Duration(t - u) }

// wall converts an instant of the lease clock to the wall clock, for display.
func (t instant) wall() time.Time { return time.Now().Add(t.sub(now())) }
