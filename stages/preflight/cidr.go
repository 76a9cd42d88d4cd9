package preflight

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"unicode"
)

// cidr is a parsed network and where it was written, so that a message
// about it can point there.
type cidr struct {
	prefix netip.Prefix
	// object and field locate the value; for a default, the field that
	// was left unset.
	object, field string
	// defaulted: the value is Capstan's default, not the user's.
	defaulted bool
	// role says what the network is for, like "pod CIDR".
	role string
}

// label is the network as a message shows it.
func (c cidr) label() string {
	if c.defaulted {
		return c.prefix.String() + " (default)"
	}
	return c.prefix.String()
}

// ref is the network as a message about another field shows it: with its
// field, and its object when that is not the one the message is about.
func (c cidr) ref(from string) string {
	where := c.field
	if c.object != from {
		where = c.object + " " + c.field
	}
	if c.defaulted {
		return fmt.Sprintf("%s (default, %s unset)", c.prefix, where)
	}
	return fmt.Sprintf("%s (%s)", c.prefix, where)
}

// parseCIDR parses a network written as address/prefix length. The
// address must be the network's first one: 10.0.0.1/16 names a host, not
// a network, and is more often a typo than intended.
func parseCIDR(s string) (netip.Prefix, error) {
	addr, bits, ok := strings.Cut(s, "/")
	if !ok {
		if _, err := netip.ParseAddr(s); err == nil {
			return netip.Prefix{}, fmt.Errorf("%q is an address, not a CIDR: add the prefix length, like %s/24", s, s)
		}
		return netip.Prefix{}, fmt.Errorf("%q is not a CIDR: expected address/prefix length, like 10.0.0.0/16", s)
	}
	a, err := netip.ParseAddr(addr)
	if err != nil || a.Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("%q is not a CIDR: %q is not an IP address", s, addr)
	}
	n, err := strconv.Atoi(bits)
	if err != nil || n < 0 || n > a.BitLen() || bits != strconv.Itoa(n) {
		return netip.Prefix{}, fmt.Errorf("%q is not a CIDR: the prefix length must be a number from 0 to %d for %s", s, a.BitLen(), familyOf(a))
	}
	p := netip.PrefixFrom(a, n)
	if a.Is4In6() {
		if n >= 96 {
			return netip.Prefix{}, fmt.Errorf("%s is an IPv4-mapped IPv6 network; write it as IPv4: %s", s, netip.PrefixFrom(a.Unmap(), n-96).Masked())
		}
		return netip.Prefix{}, fmt.Errorf("%s is an IPv4-mapped IPv6 network; write it as IPv4", s)
	}
	if m := p.Masked(); m != p {
		return netip.Prefix{}, fmt.Errorf("%s: host bits set; did you mean %s?", s, m)
	}
	return p, nil
}

// parseAddr parses an IP address without a zone.
func parseAddr(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("%q is not an IP address", s)
	}
	return a, nil
}

// splitList splits a list written with commas, spaces or newlines.
func splitList(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r == ',' || unicode.IsSpace(r) })
}

// family is an IP version.
type family int

const (
	ipv4 family = 4
	ipv6 family = 6
)

func (f family) String() string {
	if f == ipv4 {
		return "IPv4"
	}
	return "IPv6"
}

func familyOf(a netip.Addr) family {
	if a.Is4() {
		return ipv4
	}
	return ipv6
}

// families is the set of IP versions a list of networks uses, in the
// order they first appear.
type families []family

func familiesOf(cs []cidr) families {
	var fs families
	for _, c := range cs {
		if f := familyOf(c.prefix.Addr()); !fs.has(f) {
			fs = append(fs, f)
		}
	}
	return fs
}

func (fs families) has(f family) bool {
	for _, g := range fs {
		if g == f {
			return true
		}
	}
	return false
}

func (fs families) String() string {
	switch len(fs) {
	case 0:
		return "no family"
	case 1:
		return fs[0].String() + "-only"
	default:
		return "dual-stack"
	}
}

// addrRange is an inclusive range of addresses of one family.
type addrRange struct {
	first, last netip.Addr
}

func (r addrRange) String() string {
	if r.first == r.last {
		return r.first.String()
	}
	return r.first.String() + "-" + r.last.String()
}

func rangeOf(p netip.Prefix) addrRange {
	return addrRange{first: p.Masked().Addr(), last: lastAddr(p)}
}

// within reports whether every address of r is in p.
func (r addrRange) within(p netip.Prefix) bool {
	return p.Contains(r.first) && p.Contains(r.last)
}

// overlaps reports whether r and p share an address.
func (r addrRange) overlaps(p netip.Prefix) bool {
	o := rangeOf(p)
	if familyOf(r.first) != familyOf(o.first) {
		return false
	}
	return r.first.Compare(o.last) <= 0 && r.last.Compare(o.first) >= 0
}

// lastAddr is the highest address of p.
func lastAddr(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr()
	if a.Is4() {
		b := a.As4()
		setHostBits(b[:], p.Bits())
		return netip.AddrFrom4(b)
	}
	b := a.As16()
	setHostBits(b[:], p.Bits())
	return netip.AddrFrom16(b)
}

func setHostBits(b []byte, bits int) {
	for i := bits; i < len(b)*8; i++ {
		b[i/8] |= 1 << (7 - i%8)
	}
}

// covers reports whether p holds all of q.
func covers(p, q netip.Prefix) bool {
	return p.Bits() <= q.Bits() && p.Contains(q.Addr())
}
