// Command release lays out the modules of this repository at one version
// as a module proxy serves them (<module>/@v/list, .info, .mod, .zip), so
// that what `go install github.com/idemkit/idem/cmd/idem@VERSION` and a
// program's `go get` will download can be built and tested before a tag
// is pushed, and without GitHub.
//
//	go run . -version v0.4.0 -proxy /tmp/proxy . postgres cmd/idem
//	go run . -version v0.4.0 -proxy /tmp/proxy -write . postgres cmd/idem
//
// Each module named (a directory relative to the repository's root, in
// an order where a module comes after the idem modules it requires) is
// copied from the working tree (the files git tracks or would add),
// its requirements on the modules released with it set to the version
// (its replace directives kept: see rewriteGoMod), tidied against the
// proxy built so far, and zipped by the module zip rules (golang.org/x/mod/zip:
// nested modules, vendor and VCS directories left out). With -write the
// go.mod and go.sum so made are written back into the working tree: the
// commit to tag as VERSION, postgres/VERSION, cmd/idem/VERSION.
//
// It is a module of its own so that golang.org/x/mod is a dependency of
// neither the root module nor the command.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
	modzip "golang.org/x/mod/zip"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("release", flag.ContinueOnError)
	version := fs.String("version", "", "the version to release, e.g. v0.4.0")
	proxyDir := fs.String("proxy", "", "the directory to write the module proxy into (created; GOPROXY=file://DIR)")
	repo := fs.String("repo", "", "the repository's root (default: git's top level of the current directory)")
	write := fs.Bool("write", false, "write the released go.mod and go.sum back into the working tree")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if !semver.IsValid(*version) || semver.Canonical(*version) != *version || module.IsPseudoVersion(*version) {
		return fmt.Errorf("-version %q is not a canonical semantic version such as v0.4.0", *version)
	}
	if *proxyDir == "" || fs.NArg() == 0 {
		return errors.New("usage: release -version VERSION -proxy DIR [-write] [-repo DIR] MODULE_DIR...")
	}
	root := *repo
	if root == "" {
		out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
		if err != nil {
			return fmt.Errorf("finding the repository's root (git rev-parse --show-toplevel): %w", err)
		}
		root = strings.TrimSpace(string(out))
	}
	root, err := filepath.Abs(root)
	if err != nil {
		return err
	}
	if *write {
		if err := requireCommitted(root); err != nil {
			return err
		}
	}
	proxy, err := filepath.Abs(*proxyDir)
	if err != nil {
		return err
	}
	r, err := newReleaser(root, proxy, *version)
	if err != nil {
		return err
	}
	defer r.close()
	for _, dir := range fs.Args() {
		if err := r.release(filepath.ToSlash(filepath.Clean(dir)), *write); err != nil {
			return fmt.Errorf("%s: %w", dir, err)
		}
	}
	fmt.Printf("GOPROXY=file://%s,%s GONOSUMDB=%s\n", proxy, r.upstream, strings.Join(r.paths(), ","))
	return nil
}

// requireCommitted refuses a working tree that differs from its commit:
// the go.sum files -write makes hold the hashes of the modules laid out
// from the working tree, and the proxies compute them from the tag, so a
// file not committed would make `go install …@VERSION` fail its checksum.
func requireCommitted(root string) error {
	out, err := exec.Command("git", "-C", root, "status", "--porcelain", "--untracked-files=all").Output()
	if err != nil {
		return fmt.Errorf("checking the working tree (git status): %w", err)
	}
	if len(out) > 0 {
		return fmt.Errorf("-write needs the working tree as committed, and these changes are not committed "+
			"(commit or remove them, or leave -write out to try the release):\n%s", out)
	}
	return nil
}

type releaser struct {
	root, proxy, version string
	files                []string          // every file of the working tree git tracks or would add, slash-separated
	moduleDirs           []string          // every directory holding a go.mod, "." the root
	released             map[string]string // module path → its directory, the modules laid out so far
	upstream             string            // the GOPROXY the third-party modules come from
	work                 string            // staging copies and a module cache of the releaser's own
	env                  []string
}

func newReleaser(root, proxy, version string) (*releaser, error) {
	out, err := exec.Command("git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		return nil, fmt.Errorf("listing the working tree's files (git ls-files): %w", err)
	}
	r := &releaser{root: root, proxy: proxy, version: version, released: map[string]string{}}
	for _, f := range strings.Split(string(out), "\x00") {
		if f == "" {
			continue
		}
		if _, err := os.Lstat(filepath.Join(root, f)); err != nil {
			continue // tracked but deleted in the working tree
		}
		r.files = append(r.files, f)
		if path.Base(f) == "go.mod" {
			r.moduleDirs = append(r.moduleDirs, path.Dir(f))
		}
	}
	r.upstream, err = goEnv("GOPROXY")
	if err != nil {
		return nil, err
	}
	cache, err := goEnv("GOMODCACHE")
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(proxy, 0o755); err != nil {
		return nil, err
	}
	if r.work, err = os.MkdirTemp("", "idem-release-"); err != nil {
		return nil, err
	}
	// The machine's module cache is a proxy of what it has downloaded:
	// third-party modules come from it first, then from upstream. The
	// releaser's own module cache keeps the versions it makes up out of
	// the machine's.
	goflags, _ := goEnv("GOFLAGS")
	r.env = append(os.Environ(),
		"GOPROXY=file://"+proxy+",file://"+filepath.Join(cache, "cache", "download")+","+r.upstream,
		"GOMODCACHE="+filepath.Join(r.work, "modcache"),
		"GOFLAGS="+strings.TrimSpace(goflags+" -modcacherw"),
		"GOWORK=off",
		"GOTOOLCHAIN=local",
	)
	return r, nil
}

func (r *releaser) close() { _ = os.RemoveAll(r.work) }

func (r *releaser) paths() []string {
	var p []string
	for k := range r.released {
		p = append(p, k)
	}
	slices.Sort(p)
	return p
}

// release lays out the module in dir (relative to the repository's root).
func (r *releaser) release(dir string, write bool) error {
	if !slices.Contains(r.moduleDirs, dir) {
		return fmt.Errorf("no go.mod in %s", filepath.Join(r.root, dir))
	}
	stage := filepath.Join(r.work, "stage", filepath.FromSlash(dir))
	if err := r.copyModule(dir, stage); err != nil {
		return err
	}
	modPath, err := r.rewriteGoMod(filepath.Join(stage, "go.mod"))
	if err != nil {
		return err
	}
	r.env = append(r.env, "GONOSUMDB="+strings.Join(append(r.paths(), modPath), ","))
	if err := r.goCmd(stage, "mod", "tidy"); err != nil {
		return err
	}
	mv := module.Version{Path: modPath, Version: r.version}
	if err := r.writeProxy(mv, stage); err != nil {
		return err
	}
	r.released[modPath] = dir
	fmt.Printf("%s@%s from %s\n", modPath, r.version, filepath.Join(r.root, dir))
	if write {
		for _, name := range []string{"go.mod", "go.sum"} {
			if err := copyFile(filepath.Join(stage, name), filepath.Join(r.root, filepath.FromSlash(dir), name)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
	}
	return nil
}

// copyModule copies the module's files, those of the modules nested in
// it left out, into stage.
func (r *releaser) copyModule(dir, stage string) error {
	prefix := dir + "/"
	if dir == "." {
		prefix = ""
	}
	for _, f := range r.files {
		if !strings.HasPrefix(f, prefix) || r.nestedIn(dir, f) {
			continue
		}
		fi, err := os.Lstat(filepath.Join(r.root, f))
		if err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			continue // a module zip holds regular files only
		}
		if err := copyFile(filepath.Join(r.root, f), filepath.Join(stage, strings.TrimPrefix(f, prefix))); err != nil {
			return err
		}
	}
	return nil
}

// nestedIn says whether file belongs to a module nested in the one at dir.
func (r *releaser) nestedIn(dir, file string) bool {
	for _, m := range r.moduleDirs {
		if m == dir || m == "." || !(dir == "." || strings.HasPrefix(m, dir+"/")) {
			continue
		}
		if strings.HasPrefix(file, m+"/") {
			return true
		}
	}
	return false
}

// rewriteGoMod requires the modules released with this one at the
// version. It keeps the replace directives: a module's own are ignored
// where it is a dependency, and a clone's development needs them (the
// postgres module's `replace github.com/idemkit/idem => ../`); a module to
// install with `go install module@version` must have none, as cmd/idem
// has none (its go.work replaces instead).
func (r *releaser) rewriteGoMod(file string) (string, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return "", err
	}
	f, err := modfile.Parse(file, data, nil)
	if err != nil {
		return "", err
	}
	if f.Module == nil {
		return "", fmt.Errorf("%s has no module line", file)
	}
	for _, req := range f.Require {
		p := req.Mod.Path
		if _, ok := r.released[p]; ok {
			if err := f.AddRequire(p, r.version); err != nil {
				return "", err
			}
			continue
		}
		if strings.HasPrefix(p, "github.com/idemkit/") {
			return "", fmt.Errorf("requires %s, which is not released before it: name its directory earlier", p)
		}
	}
	f.Cleanup()
	out, err := f.Format()
	if err != nil {
		return "", err
	}
	return f.Module.Mod.Path, os.WriteFile(file, out, 0o644)
}

// writeProxy writes the module's .info, .mod and .zip and lists the
// version, as GOPROXY=file://DIR reads them.
func (r *releaser) writeProxy(mv module.Version, stage string) error {
	esc, err := module.EscapePath(mv.Path)
	if err != nil {
		return err
	}
	dir := filepath.Join(r.proxy, filepath.FromSlash(esc), "@v")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{mv.Version, time.Now().UTC().Truncate(time.Second)})
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, mv.Version+".info"), info, 0o644); err != nil {
		return err
	}
	if err := copyFile(filepath.Join(stage, "go.mod"), filepath.Join(dir, mv.Version+".mod")); err != nil {
		return err
	}
	zf, err := os.Create(filepath.Join(dir, mv.Version+".zip"))
	if err != nil {
		return err
	}
	if err := modzip.CreateFromDir(zf, mv, stage); err != nil {
		zf.Close()
		return fmt.Errorf("zipping %s: %w", mv, err)
	}
	if err := zf.Close(); err != nil {
		return err
	}
	list, err := os.ReadFile(filepath.Join(dir, "list"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	versions := strings.Fields(string(list))
	if !slices.Contains(versions, mv.Version) {
		versions = append(versions, mv.Version)
	}
	return os.WriteFile(filepath.Join(dir, "list"), []byte(strings.Join(versions, "\n")+"\n"), 0o644)
}

func (r *releaser) goCmd(dir string, args ...string) error {
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = r.env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out.String())
	}
	return nil
}

func goEnv(name string) (string, error) {
	out, err := exec.Command("go", "env", name).Output()
	if err != nil {
		return "", fmt.Errorf("go env %s: %w", name, err)
	}
	return strings.TrimSpace(string(out)), nil
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		return err
	}
	out, err := os.Create(to)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
