// Package webconfig writes exporter-toolkit web configurations for tests:
// the --web.config.file of backstop-exporter and backstop console.
package webconfig

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/crypto/bcrypt"
)

// BasicAuth writes a web configuration with one basic-auth user (the
// password bcrypt-hashed at the lowest cost: tests only) into a new
// temporary directory of t and returns its path.
func BasicAuth(t testing.TB, user, password string) string {
	t.Helper()
	hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "web.yml")
	if err := os.WriteFile(path, []byte("basic_auth_users:\n  "+user+": "+string(hash)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
