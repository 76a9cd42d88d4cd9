package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/spf13/pflag"

	"github.com/capstan-dev/capstan/reconciler"
)

// devListenDefaults are `run`'s ports on loopback: a demo on a laptop
// serves nobody else. The push receiver is on, as a demo is where one
// tries it.
var devListenDefaults = listenFlags{metricsAddr: "127.0.0.1:8080", healthAddr: "127.0.0.1:8081", webhookAddr: "127.0.0.1:9292"}

// devServe is where the demo's daemon serves, once checked.
type devServe struct {
	metricsAddr, healthAddr string
	webhook                 *reconciler.WebhookOptions
	// tokenFile holds the generic endpoint's bearer token when the
	// demo made one up; "" when it came from the environment.
	tokenFile string
	// notes say which default ports were taken and moved.
	notes []string
}

// resolveDevServe checks the addresses before anything starts: one
// given on the command line that is taken is an error; a default that is
// taken (another demo, a daemon of your own) moves to a free port, with a
// note. The generic webhook endpoint gets a token in tokenFile when
// $CAPSTAN_WEBHOOK_TOKEN is not set.
func resolveDevServe(f listenFlags, changed *pflag.FlagSet, tokenFile string) (*devServe, error) {
	s := &devServe{}
	var errs []error
	check := func(flag, addr string) string {
		got, note, err := checkListenAddr(flag, addr, changed != nil && changed.Changed(flag))
		if err != nil {
			errs = append(errs, err)
		}
		if note != "" {
			s.notes = append(s.notes, note)
		}
		return got
	}
	s.metricsAddr = check("metrics-addr", f.metricsAddr)
	s.healthAddr = check("health-addr", f.healthAddr)
	if addr := check("webhook-addr", f.webhookAddr); addr != "0" {
		f.webhookAddr = addr
		s.webhook = f.webhook()
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if s.webhook != nil && len(s.webhook.GenericToken) == 0 {
		token := make([]byte, 16)
		if _, err := rand.Read(token); err != nil {
			return nil, err
		}
		s.webhook.GenericToken = []byte(hex.EncodeToString(token))
		if err := os.WriteFile(tokenFile, append(s.webhook.GenericToken, '\n'), 0o600); err != nil {
			return nil, fmt.Errorf("write the webhook token: %w", err)
		}
		s.tokenFile = tokenFile
	}
	return s, nil
}

// checkListenAddr returns addr when it can be listened on, "0" for off, or
// a free port on the same host when addr is a default that is taken.
func checkListenAddr(flag, addr string, explicit bool) (string, string, error) {
	if addr == "0" || addr == "" {
		return "0", "", nil
	}
	l, err := net.Listen("tcp", addr)
	if err == nil {
		bound := l.Addr().String()
		l.Close()
		return bound, "", nil
	}
	if explicit {
		return "", "", fmt.Errorf("--%s %s: %w; pick another address, \"127.0.0.1:0\" for any free port, or \"0\" to turn it off", flag, addr, err)
	}
	host, _, splitErr := net.SplitHostPort(addr)
	if splitErr != nil {
		return "", "", fmt.Errorf("--%s %s: %w", flag, addr, splitErr)
	}
	l, err2 := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err2 != nil {
		return "", "", fmt.Errorf("--%s %s: %w, and no other port is free: %w", flag, addr, err, err2)
	}
	bound := l.Addr().String()
	l.Close()
	return bound, fmt.Sprintf("%s is taken (%v); --%s %s instead", addr, err, flag, bound), nil
}

// lines say where the daemon serves, for people: URLs, and a curl that
// sends a push through the generic endpoint.
func (s *devServe) lines(webhookURL, rootURL, branch string) []string {
	var out []string
	switch {
	case s.metricsAddr != "0" && s.healthAddr != "0":
		out = append(out, fmt.Sprintf("metrics http://%s/metrics, health http://%s/readyz", s.metricsAddr, s.healthAddr))
	case s.metricsAddr != "0":
		out = append(out, fmt.Sprintf("metrics http://%s/metrics", s.metricsAddr))
	case s.healthAddr != "0":
		out = append(out, fmt.Sprintf("health http://%s/readyz", s.healthAddr))
	}
	if webhookURL == "" {
		return out
	}
	token := "$CAPSTAN_WEBHOOK_TOKEN"
	if s.tokenFile != "" {
		token = "$(cat " + shellQuote(s.tokenFile) + ")"
	}
	out = append(out, fmt.Sprintf("push webhook %s{github,gitlab,gitea,generic}; a push through the generic one:", webhookURL),
		fmt.Sprintf(`    curl -H "Authorization: Bearer %s" -d '{"url": "%s", "branch": "%s"}' %sgeneric`, token, rootURL, branch, webhookURL))
	return out
}
