package fencedlock_test

import (
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
)

// A blackhole is a TCP proxy to the server that can cut the network: from
// cut() on it drops every byte both ways and forwards no new connection,
// keeping the sockets open, as a partition does (nothing is refused or
// reset; requests simply get no answer).
type blackhole struct {
	ln     net.Listener
	target string
	cutAt  atomic.Bool
	mu     sync.Mutex
	conns  []net.Conn
	dead   map[net.Conn]bool // cutExisting: these drop everything
}

func startBlackhole(t *testing.T) *blackhole {
	t.Helper()
	u, err := url.Parse(dbDSN)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &blackhole{ln: ln, target: u.Host}
	t.Cleanup(b.close)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b.track(c)
			if b.cutAt.Load() {
				continue // accepted, never answered
			}
			s, err := net.Dial("tcp", b.target)
			if err != nil {
				c.Close()
				continue
			}
			b.track(s)
			go b.pipe(c, s)
			go b.pipe(s, c)
		}
	}()
	return b
}

func (b *blackhole) track(c net.Conn) {
	b.mu.Lock()
	b.conns = append(b.conns, c)
	b.mu.Unlock()
}

func (b *blackhole) pipe(from, to net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := from.Read(buf)
		if err != nil {
			to.Close()
			return
		}
		b.mu.Lock()
		dead := b.dead[from] || b.dead[to]
		b.mu.Unlock()
		if dead || b.cutAt.Load() {
			continue
		}
		if _, err := to.Write(buf[:n]); err != nil {
			return
		}
	}
}

func (b *blackhole) cut() { b.cutAt.Store(true) }

// cutExisting makes the connections open now die silently; new ones work.
func (b *blackhole) cutExisting() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.dead == nil {
		b.dead = map[net.Conn]bool{}
	}
	for _, c := range b.conns {
		b.dead[c] = true
	}
}

func (b *blackhole) close() {
	b.ln.Close()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range b.conns {
		c.Close()
	}
}

// dsn is the test database's URL through the proxy.
func (b *blackhole) dsn(t *testing.T) string {
	u, err := url.Parse(dbDSN)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = b.ln.Addr().String()
	return u.String()
}
