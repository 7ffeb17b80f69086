// Command modzip writes a Go module in the module proxy's layout, as `go
// get` fetches it from GOPROXY (https://go.dev/ref/mod#goproxy-protocol):
//
//	OUT/MODULE/@v/list             the versions, one a line
//	OUT/MODULE/@v/VERSION.info     {"Version": ..., "Time": ...}
//	OUT/MODULE/@v/VERSION.mod      the go.mod
//	OUT/MODULE/@v/VERSION.zip      every file under MODULE@VERSION/
//
// usage: modzip -dir MODULE_DIR -version vX.Y.Z -time RFC3339 -out OUT [-license FILE] FILE...
//
// FILEs are the module's files, relative to -dir (the caller lists what git
// tracks); modzip refuses what the go command would refuse in a module zip
// and leaves out nested modules. -license adds the repository's LICENSE when
// the module directory has none, as the go command does for a module in a
// subdirectory of its repository.
package main

import (
	"archive/zip"
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
	"unicode"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "modzip:", err)
		os.Exit(1)
	}
}

var semver = regexp.MustCompile(`^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$`)

func run() error {
	dir := flag.String("dir", "", "the module's directory")
	version := flag.String("version", "", "the version, vX.Y.Z")
	when := flag.String("time", "", "the version's time, RFC 3339 (the commit's)")
	out := flag.String("out", "", "the output directory")
	license := flag.String("license", "", "a LICENSE to add when the module has none")
	flag.Parse()
	if *dir == "" || *out == "" || !semver.MatchString(*version) {
		return errors.New("usage: modzip -dir DIR -version vX.Y.Z -time RFC3339 -out OUT [-license FILE] FILE...")
	}
	t, err := time.Parse(time.RFC3339, *when)
	if err != nil {
		return fmt.Errorf("-time: %w", err)
	}
	gomod, err := os.ReadFile(filepath.Join(*dir, "go.mod"))
	if err != nil {
		return err
	}
	module := modulePath(gomod)
	if module == "" {
		return errors.New("go.mod has no module line")
	}

	files, err := selectFiles(*dir, flag.Args())
	if err != nil {
		return err
	}
	if *license != "" && !contains(files, "LICENSE") {
		files = append(files, "LICENSE")
	}
	sort.Strings(files)

	at := filepath.Join(*out, filepath.FromSlash(escape(module)), "@v")
	if err := os.MkdirAll(at, 0o755); err != nil {
		return err
	}
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	folded := map[string]string{}
	for _, f := range files {
		src := filepath.Join(*dir, filepath.FromSlash(f))
		if f == "LICENSE" && *license != "" && !fileExists(src) {
			src = *license
		}
		if prev, ok := folded[strings.ToLower(f)]; ok {
			return fmt.Errorf("%s and %s differ only in case", prev, f)
		}
		folded[strings.ToLower(f)] = f
		w, err := zw.CreateHeader(&zip.FileHeader{Name: module + "@" + *version + "/" + f, Method: zip.Deflate, Modified: t})
		if err != nil {
			return err
		}
		r, err := os.Open(src)
		if err != nil {
			return err
		}
		_, err = io.Copy(w, r)
		r.Close()
		if err != nil {
			return err
		}
	}
	if err := zw.Close(); err != nil {
		return err
	}
	info, _ := json.Marshal(struct {
		Version string
		Time    string
	}{*version, t.UTC().Format(time.RFC3339)})
	for name, data := range map[string][]byte{
		*version + ".zip":  buf.Bytes(),
		*version + ".mod":  gomod,
		*version + ".info": append(info, '\n'),
		"list":             []byte(*version + "\n"),
	} {
		if err := os.WriteFile(filepath.Join(at, name), data, 0o644); err != nil {
			return err
		}
	}
	fmt.Printf("%s@%s: %d files, %d bytes, in %s\n", module, *version, len(files), buf.Len(), at)
	return nil
}

func modulePath(gomod []byte) string {
	sc := bufio.NewScanner(bytes.NewReader(gomod))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && f[0] == "module" {
			return strings.Trim(f[1], `"`)
		}
	}
	return ""
}

// selectFiles keeps what a module zip holds: regular files, outside
// version-control directories, vendor directories and nested modules.
func selectFiles(dir string, names []string) ([]string, error) {
	nested := map[string]bool{}
	for _, n := range names {
		if path.Base(n) == "go.mod" && path.Dir(n) != "." {
			nested[path.Dir(n)] = true
		}
	}
	var keep []string
	for _, n := range names {
		n = path.Clean(filepath.ToSlash(n))
		if strings.HasPrefix(n, "../") || path.IsAbs(n) {
			return nil, fmt.Errorf("%s: outside the module", n)
		}
		skip := false
		for d := path.Dir(n); d != "."; d = path.Dir(d) {
			b := path.Base(d)
			if nested[d] || b == "vendor" || b == ".git" || b == ".hg" || b == ".svn" || b == ".bzr" {
				skip = true
				break
			}
		}
		if skip {
			continue
		}
		fi, err := os.Lstat(filepath.Join(dir, filepath.FromSlash(n)))
		if err != nil {
			return nil, err
		}
		if !fi.Mode().IsRegular() {
			continue // symlinks and the like are left out, as the go command does
		}
		if err := checkPath(n); err != nil {
			return nil, err
		}
		keep = append(keep, n)
	}
	return keep, nil
}

// checkPath applies the go command's rules for file paths in a module zip
// (golang.org/x/mod/module.CheckFilePath), in short: printable, no
// backslash, colon or shell-special characters, no element beginning with
// a dot-dot or ending in a dot.
func checkPath(p string) error {
	for _, elem := range strings.Split(p, "/") {
		if elem == "" || elem == "." || elem == ".." || strings.HasSuffix(elem, ".") {
			return fmt.Errorf("%s: invalid path element %q", p, elem)
		}
		for _, r := range elem {
			if r > unicode.MaxASCII && unicode.IsLetter(r) {
				continue
			}
			if r < ' ' || r == 0x7f || strings.ContainsRune("\"'*<>?`|\\:", r) {
				return fmt.Errorf("%s: invalid character %q", p, r)
			}
		}
	}
	return nil
}

// escape is the proxy's case encoding: an upper-case letter becomes '!'
// and its lower case.
func escape(module string) string {
	var b strings.Builder
	for _, r := range module {
		if unicode.IsUpper(r) {
			b.WriteByte('!')
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
