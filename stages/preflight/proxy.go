package preflight

import (
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// checkProxies checks the proxy URLs and the noProxy list and, when a
// proxy is set, that noProxy keeps the cluster's own traffic off it.
//
// A noProxy that misses the pod, service or control-plane networks is a
// warning, not an error: components that ignore the proxy variables, or
// a proxy that routes those addresses back, make it work, and Capstan
// cannot tell. Where neither holds, API and pod traffic goes to the proxy.
func (v *validation) checkProxies(c *networkConfig) {
	proxied := false
	for _, key := range []string{KeyHTTPProxy, KeyHTTPSProxy} {
		if s := strings.TrimSpace(c.values[key]); s != "" {
			proxied = true
			v.checkProxyURL(c.object, "data."+key, s)
		}
	}
	bypass := v.readNoProxy(c)
	if !proxied {
		return
	}
	for _, n := range slices.Concat(c.services, c.pods, c.controlPlane) {
		if !bypass.covers(n.prefix) {
			v.warnf(c.object, "data."+KeyNoProxy, "does not cover the %s %s: with a proxy set, traffic to it goes through the proxy; add %s",
				n.role, n.label(), n.prefix)
		}
	}
}

// checkProxyURL checks a proxy URL without ever repeating its password.
func (v *validation) checkProxyURL(object, field, s string) {
	const like = "expected a URL like http://proxy.example:3128"
	if !strings.Contains(s, "://") {
		v.errorf(object, field, "no scheme; %s", like)
		return
	}
	u, err := url.Parse(s)
	if err != nil {
		// url.Error repeats the URL, password included; keep only why.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		v.errorf(object, field, "not a URL (%v); %s", err, like)
		return
	}
	shown := s
	if u.User != nil {
		shown = u.Redacted()
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		v.errorf(object, field, "%s: the scheme must be http or https; %s", shown, like)
	case u.Hostname() == "":
		v.errorf(object, field, "%s has no host; %s", shown, like)
	case !validHost(u.Hostname()):
		v.errorf(object, field, "%s: %q is neither a hostname nor an IP address", shown, u.Hostname())
	case u.Port() != "" && !validPort(u.Port()):
		v.errorf(object, field, "%s: port %q must be a number from 1 to 65535", shown, u.Port())
	}
}

// bypassList is what noProxy exempts: every destination, or these
// networks (hostnames cannot cover a network).
type bypassList struct {
	all      bool
	prefixes []netip.Prefix
}

func (b bypassList) covers(p netip.Prefix) bool {
	return b.all || slices.ContainsFunc(b.prefixes, func(q netip.Prefix) bool { return covers(q, p) })
}

// readNoProxy checks every noProxy entry: `*`, a CIDR, an IP address
// (with a port, or an IPv6 one in brackets), a hostname (with a port) or
// a domain suffix (.example.com or *.example.com).
func (v *validation) readNoProxy(c *networkConfig) bypassList {
	var b bypassList
	for i, e := range splitList(c.values[KeyNoProxy]) {
		field := fmt.Sprintf("data.%s[%d]", KeyNoProxy, i)
		if e == "*" {
			b.all = true
			continue
		}
		if strings.Contains(e, "/") {
			p, err := parseCIDR(e)
			if err != nil {
				v.errorf(c.object, field, "%v", err)
				continue
			}
			b.prefixes = append(b.prefixes, p)
			continue
		}
		if a, ok := noProxyAddr(e); ok {
			b.prefixes = append(b.prefixes, netip.PrefixFrom(a, a.BitLen()))
			continue
		}
		host := e
		if h, port, ok := strings.Cut(e, ":"); ok {
			if !validPort(port) {
				v.errorf(c.object, field, "%q: port %q must be a number from 1 to 65535", e, port)
				continue
			}
			host = h
		}
		host = strings.TrimPrefix(strings.TrimPrefix(host, "*"), ".")
		if !validHostname(host) {
			v.errorf(c.object, field, "%q is not a hostname, domain suffix (.example.com), IP address or CIDR", e)
		}
	}
	return b
}

// noProxyAddr parses an IP address entry, with or without a port or
// brackets.
func noProxyAddr(e string) (netip.Addr, bool) {
	if a, err := parseAddr(strings.TrimSuffix(strings.TrimPrefix(e, "["), "]")); err == nil {
		return a, true
	}
	if ap, err := netip.ParseAddrPort(e); err == nil && ap.Addr().Zone() == "" && ap.Port() != 0 {
		return ap.Addr(), true
	}
	return netip.Addr{}, false
}

func validPort(s string) bool {
	n, err := strconv.Atoi(s)
	return err == nil && n >= 1 && n <= 65535 && s == strconv.Itoa(n)
}

func validHost(h string) bool {
	_, err := parseAddr(h)
	return err == nil || validHostname(h)
}

// validHostname reports whether h is a DNS name: dot-separated labels of
// letters, digits and inner hyphens, the last not all digits (so that a
// mistyped IP address is not taken for a name).
func validHostname(h string) bool {
	if h == "" || len(h) > 253 {
		return false
	}
	labels := strings.Split(h, ".")
	for _, l := range labels {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for _, r := range l {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-') {
				return false
			}
		}
	}
	return strings.Trim(labels[len(labels)-1], "0123456789") != ""
}
