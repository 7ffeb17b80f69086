package fencedlock_test

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	fencedlock "github.com/fenced-lock/fenced_lock/clients/go"
)

// The client is versioned with the extension (clients/README.md): its
// Version is the extension's, which is the crate's (fenced_lock.control
// takes it from Cargo.toml).
func TestVersionIsTheExtensionsVersion(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../Cargo.toml")
	if err != nil {
		t.Skipf("no Cargo.toml two levels up (not in the repository): %v", err)
	}
	m := regexp.MustCompile(`(?m)^version\s*=\s*"([^"]+)"`).FindSubmatch(b)
	if m == nil {
		t.Fatal("Cargo.toml has no version")
	}
	ext, client := string(m[1]), fencedlock.Version
	switch c := compareVersions(ext, client); {
	case c == 0:
	case c > 0:
		t.Fatalf("the extension is %s, the Go client still %s", ext, client)
	default:
		// while the extension is being brought to the version the client
		// was written for
		t.Skipf("the extension in this tree is still %s; the client is already %s", ext, client)
	}
}

func compareVersions(a, b string) int {
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(pa) || i < len(pb); i++ {
		var x, y int
		if i < len(pa) {
			x, _ = strconv.Atoi(pa[i])
		}
		if i < len(pb) {
			y, _ = strconv.Atoi(pb[i])
		}
		if x != y {
			if x < y {
				return -1
			}
			return 1
		}
	}
	return 0
}
