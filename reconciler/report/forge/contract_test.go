package forge

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// This file holds what the fakes of GitHub and GitLab share. They stand in
// for SaaS forges that cannot run in a test: each implements only the
// documented endpoints Capstan calls, answers with the documented payloads
// under testdata/, and pages its lists the way the forge documents, so
// that the providers' paging is exercised too.

// plantedToken is a token the tests give providers so that they can check
// it never shows in an error.
const plantedToken = "capstan-planted-token-7f3a9c1e5b"

// loadJSON reads testdata/<name> into a fresh value (a map or a slice).
func loadJSON(t testing.TB, name string) any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", filepath.FromSlash(name)))
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("testdata/%s: %v", name, err)
	}
	return v
}

// loadObject reads testdata/<name>, a JSON object.
func loadObject(t testing.TB, name string) map[string]any {
	t.Helper()
	m, ok := loadJSON(t, name).(map[string]any)
	if !ok {
		t.Fatalf("testdata/%s: not a JSON object", name)
	}
	return m
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// page cuts items to the page the request asks for (page, per_page; the
// forge's default and maximum page size) and returns the next page number,
// 0 on the last page, and the Link header both forges send.
func page[T any](r *http.Request, items []T, defaultSize, maxSize int) ([]T, int, string) {
	q := r.URL.Query()
	size, _ := strconv.Atoi(q.Get("per_page"))
	if size <= 0 {
		size = defaultSize
	}
	size = min(size, maxSize)
	n, _ := strconv.Atoi(q.Get("page"))
	n = max(n, 1)
	from := min((n-1)*size, len(items))
	to := min(from+size, len(items))
	next := 0
	if to < len(items) {
		next = n + 1
	}
	last := max(1, (len(items)+size-1)/size)
	link := func(p int, rel string) string {
		u := url.URL{Scheme: "http", Host: r.Host, Path: r.URL.Path}
		qq := r.URL.Query()
		qq.Set("page", strconv.Itoa(p))
		qq.Set("per_page", strconv.Itoa(size))
		u.RawQuery = qq.Encode()
		return fmt.Sprintf("<%s>; rel=%q", u.String(), rel)
	}
	var links []string
	if next != 0 {
		links = append(links, link(next, "next"))
	}
	links = append(links, link(1, "first"), link(last, "last"))
	return items[from:to], next, strings.Join(links, ", ")
}

// countRunes is how GitHub and GitLab measure a body.
func countRunes(s string) int { return len([]rune(s)) }
