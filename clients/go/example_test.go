package fencedlock_test

import (
	"context"
	"errors"
	"log"
	"time"

	fencedlock "github.com/fenced-lock/fenced_lock/clients/go"
)

// The README's example: a sale under the lock of its item, written with
// the token, run again by Do when the database refuses the write (FL001).
func ExampleLocker_Do() {
	ctx := context.Background()
	locker, err := fencedlock.New("postgresql://app@db.internal/shop")
	if err != nil {
		log.Fatal(err)
	}
	err = locker.Do(ctx, "inventory:1", func(ctx context.Context, lease *fencedlock.Lease) error {
		tx, err := lease.Conn().Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		var stock int
		if err := tx.QueryRow(ctx, "SELECT stock FROM inventory WHERE item_id = 1").Scan(&stock); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, "UPDATE inventory SET stock = $1, fence_token = $2 WHERE item_id = 1",
			stock-1, lease.Token())
		if err != nil {
			return err // FL001 if the lease was lost since the acquire: Do retries
		}
		return tx.Commit(ctx)
	}, fencedlock.WithTTL(10*time.Second))
	if errors.Is(err, fencedlock.ErrStaleToken) {
		log.Print("lost the lease on every attempt")
	}
}

// A lease held by hand: stop the work when it is lost, release on the way out.
func ExampleLocker_Acquire() {
	ctx := context.Background()
	locker, err := fencedlock.New("postgresql://app@db.internal/reports")
	if err != nil {
		log.Fatal(err)
	}
	lease, err := locker.Acquire(ctx, "report:daily", fencedlock.WithTTL(30*time.Second),
		fencedlock.WithWait(time.Minute))
	if errors.Is(err, fencedlock.ErrWaitTimeout) {
		return // someone else is building it
	}
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)
	for part := 0; part < 10; part++ {
		select {
		case <-lease.Done():
			log.Print(lease.Err()) // lost: stop, do not write
			return
		case <-time.After(time.Second): // a part of the work
		}
	}
	_, err = lease.Conn().Exec(ctx, "INSERT INTO reports (day, fence_token) VALUES (current_date, $1)", lease.Token())
	if errors.Is(fencedlock.Wrap(err), fencedlock.ErrStaleToken) {
		log.Print("lost just before the write: the database refused it")
	}
}
