// Package javatest runs classes of the JVM host (sdk/java) from Go tests:
// the crash tests' Java workers, the idempotency interop. It builds
// sdk/java with Maven once per test binary (`mvn package -DskipTests`,
// which also copies the runtime and test dependencies to target/lib and
// target/test-lib), under a file lock so that test packages running at once
// do not build into the same target/ together. java and mvn must be
// installed (`make deps`): without them the test fails, it never skips.
package javatest

import (
	"crypto/sha256"
	"encoding/hex"
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
		buildOut, buildErr = exec.Command(mvn, "-B", "-q", "-f", filepath.Join(root, "sdk/java/pom.xml"), "-DskipTests", "package").CombinedOutput()
	})
	if buildErr != nil {
		t.Fatalf("mvn package (sdk/java): %v\n%s", buildErr, buildOut)
	}
	return filepath.Join(root, "sdk/java/target")
}
