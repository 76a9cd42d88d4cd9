package promserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Options configure a server.
type Options struct {
	// Binary is the prometheus executable.
	Binary string
	// Config is the content of prometheus.yml. Relative paths in it (rule
	// files) are relative to the server's directory.
	Config string
	// Files are written into the server's directory before it starts,
	// by name: rule files the Config names.
	Files map[string][]byte
	// Dir holds the configuration, the TSDB and prometheus.log. Empty means
	// a new temporary directory, removed by Close.
	Dir string
}

// Server is a running prometheus on 127.0.0.1.
type Server struct {
	// URL is the server's base URL, http://127.0.0.1:PORT.
	URL string
	// Dir holds the configuration, the data and prometheus.log.
	Dir string

	removeDir bool
	cmd       *exec.Cmd
	exited    chan struct{}
	waitErr   error
	closeOnce sync.Once
	client    *http.Client
}

// startAttempts bounds the retries when the chosen port was taken between
// choosing it and prometheus binding it.
const startAttempts = 3

// Start starts prometheus on a free loopback port and returns once it is
// ready. ctx bounds the start only.
func Start(ctx context.Context, opts Options) (*Server, error) {
	s := &Server{Dir: opts.Dir, client: &http.Client{Timeout: 10 * time.Second}}
	if s.Dir == "" {
		dir, err := os.MkdirTemp("", "capstan-prometheus-")
		if err != nil {
			return nil, fmt.Errorf("start prometheus: %w", err)
		}
		s.Dir, s.removeDir = dir, true
	}
	files := map[string][]byte{"prometheus.yml": []byte(opts.Config)}
	for name, data := range opts.Files {
		files[name] = data
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(s.Dir, name), data, 0o644); err != nil {
			return nil, errors.Join(fmt.Errorf("start prometheus: %w", err), s.cleanup())
		}
	}
	var err error
	for range startAttempts {
		if err = s.start(ctx, opts.Binary); err == nil || !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	if err != nil {
		return nil, errors.Join(err, s.cleanup())
	}
	return s, nil
}

func (s *Server) start(ctx context.Context, binary string) error {
	addr, err := FreeAddr()
	if err != nil {
		return err
	}
	logFile, err := os.Create(filepath.Join(s.Dir, "prometheus.log"))
	if err != nil {
		return fmt.Errorf("start prometheus: %w", err)
	}
	defer logFile.Close()
	s.URL = "http://" + addr
	s.cmd = exec.Command(binary,
		"--config.file="+filepath.Join(s.Dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(s.Dir, "data"),
		"--web.listen-address="+addr,
		"--log.level=info",
	)
	s.cmd.Dir = s.Dir
	s.cmd.Stdout, s.cmd.Stderr = logFile, logFile
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("start prometheus: %w", err)
	}
	s.exited = make(chan struct{})
	go func() {
		s.waitErr = s.cmd.Wait()
		close(s.exited)
	}()
	if err := s.waitReady(ctx); err != nil {
		s.stop()
		return fmt.Errorf("start prometheus on %s: %w\n%s", addr, err, s.Log())
	}
	return nil
}

func (s *Server) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	ticker := time.NewTicker(100 * time.Millisecond)
	defer ticker.Stop()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+"/-/ready", nil)
		if resp, err := s.client.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-s.exited:
			return fmt.Errorf("prometheus exited: %v", s.waitErr)
		case <-ctx.Done():
			return fmt.Errorf("not ready: %w", ctx.Err())
		case <-ticker.C:
		}
	}
}

// Log returns what prometheus printed so far, for a failing test.
func (s *Server) Log() string {
	data, _ := os.ReadFile(filepath.Join(s.Dir, "prometheus.log"))
	return string(data)
}

func (s *Server) stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
}

func (s *Server) cleanup() error {
	if s.removeDir {
		return os.RemoveAll(s.Dir)
	}
	return nil
}

// Close kills prometheus and removes its temporary directory.
func (s *Server) Close() error {
	var err error
	s.closeOnce.Do(func() {
		s.stop()
		err = s.cleanup()
	})
	return err
}

// FreeAddr returns a loopback address with a port free at the time of the
// call.
func FreeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// Alert is one active alert: pending or firing.
type Alert struct {
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	State       string            `json:"state"`
	ActiveAt    time.Time         `json:"activeAt"`
	Value       string            `json:"value"`
}

// Alerts returns the active alerts (GET /api/v1/alerts). A resolved alert
// is not listed.
func (s *Server) Alerts(ctx context.Context) ([]Alert, error) {
	var data struct {
		Alerts []Alert `json:"alerts"`
	}
	if err := s.get(ctx, "/api/v1/alerts", &data); err != nil {
		return nil, err
	}
	return data.Alerts, nil
}

// Sample is one element of an instant vector.
type Sample struct {
	Metric map[string]string `json:"metric"`
	// Value is the sample value as Prometheus formats it.
	Value string
}

// Query evaluates an instant query (GET /api/v1/query) that returns a
// vector.
func (s *Server) Query(ctx context.Context, expr string) ([]Sample, error) {
	var data struct {
		ResultType string `json:"resultType"`
		Result     []struct {
			Metric map[string]string `json:"metric"`
			Value  [2]any            `json:"value"`
		} `json:"result"`
	}
	if err := s.get(ctx, "/api/v1/query?query="+url.QueryEscape(expr), &data); err != nil {
		return nil, err
	}
	if data.ResultType != "vector" {
		return nil, fmt.Errorf("query %s: result type %s, want vector", expr, data.ResultType)
	}
	out := make([]Sample, len(data.Result))
	for i, r := range data.Result {
		out[i] = Sample{Metric: r.Metric, Value: fmt.Sprint(r.Value[1])}
	}
	return out, nil
}

func (s *Server) get(ctx context.Context, path string, into any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+path, nil)
	if err != nil {
		return err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	var envelope struct {
		Status string          `json:"status"`
		Data   json.RawMessage `json:"data"`
		Error  string          `json:"error"`
	}
	if err := json.Unmarshal(body, &envelope); err != nil {
		return fmt.Errorf("GET %s: %s: %w", path, bytes.TrimSpace(body), err)
	}
	if envelope.Status != "success" {
		return fmt.Errorf("GET %s: %s: %s", path, envelope.Status, envelope.Error)
	}
	return json.Unmarshal(envelope.Data, into)
}
