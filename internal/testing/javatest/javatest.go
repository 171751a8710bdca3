// Package javatest runs classes of the JVM host (sdk/java) from Go tests:
// the crash tests' Java workers, the idempotency interop, the crosshost
// decide command. It builds sdk/java with Maven (`mvn package -DskipTests`,
// which also copies the runtime and test dependencies to target/lib and
// target/test-lib) at most once per test binary, under a file lock so that
// test packages running at once do not build into the same target/
// together; a build stamped newer than every input (the pom, the sources,
// what it takes from contract/) is not made again by the next binary. java and mvn must be
// installed (`make deps`): without them the test fails, it never skips.
package javatest

import (
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
)

var (
	build    sync.Once
	buildOut []byte
	buildErr error
)

// Root is the repository's root.
func Root() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "../../.."))
}

// Command returns the command that runs class (dev.backstop.<class>, from
// sdk/java's main or test classes) with args, its classpath built.
func Command(t testing.TB, class string, args ...string) *exec.Cmd {
	t.Helper()
	java := Java(t)
	target := Build(t)
	cp := strings.Join([]string{filepath.Join(target, "test-classes"), filepath.Join(target, "classes"),
		filepath.Join(target, "test-lib", "*")}, string(os.PathListSeparator))
	// A short-lived test process: the client compiler only starts it sooner.
	return exec.Command(java, append([]string{"-XX:TieredStopAtLevel=1", "-cp", cp, "dev.backstop." + class}, args...)...)
}

// Java returns the path of the java command.
func Java(t testing.TB) string {
	t.Helper()
	java, err := exec.LookPath("java")
	if err != nil {
		t.Fatalf("java not found (the JVM runs sdk/java): install it, or run `make test`")
	}
	return java
}

// Build builds sdk/java once per test binary and returns its target
// directory (the jar, classes, test-classes, lib and test-lib).
func Build(t testing.TB) string {
	t.Helper()
	mvn, err := exec.LookPath("mvn")
	if err != nil {
		t.Fatalf("mvn not found (Maven builds sdk/java): install it, or run `make test`")
	}
	root := Root()
	build.Do(func() {
		sum := sha256.Sum256([]byte(root))
		lock, err := os.OpenFile(filepath.Join(os.TempDir(), "backstop-java-build-"+hex.EncodeToString(sum[:6])+".lock"), os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			buildErr = err
			return
		}
		defer lock.Close()
		if buildErr = syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); buildErr != nil {
			return
		}
		defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
		stamp := filepath.Join(root, "sdk/java/target/javatest.stamp")
		if fresh(root, stamp) { // another test binary of this run built it
			return
		}
		buildOut, buildErr = exec.Command(mvn, "-B", "-q", "-f", filepath.Join(root, "sdk/java/pom.xml"), "-DskipTests", "package").CombinedOutput()
		if buildErr == nil {
			buildErr = os.WriteFile(stamp, nil, 0o644)
		}
	})
	if buildErr != nil {
		t.Fatalf("mvn package (sdk/java): %v\n%s", buildErr, buildOut)
	}
	return filepath.Join(root, "sdk/java/target")
}

// fresh reports whether the build stamped by stamp is newer than every
// input of sdk/java's build: its pom and sources, and what it takes from
// contract/ (the module, the error kinds, the scripts).
func fresh(root, stamp string) bool {
	st, err := os.Stat(stamp)
	if err != nil {
		return false
	}
	built := st.ModTime()
	stale := false
	for _, in := range []string{"sdk/java/pom.xml", "sdk/java/src", "contract/backstop.wasm", "contract/errorkinds.json", "contract/scripts"} {
		filepath.WalkDir(filepath.Join(root, in), func(_ string, d fs.DirEntry, err error) error {
			if err != nil {
				stale = true
				return err
			}
			if info, err := d.Info(); err != nil || !info.ModTime().Before(built) {
				stale = true
				return filepath.SkipAll
			}
			return nil
		})
		if stale {
			return false
		}
	}
	return true
}
