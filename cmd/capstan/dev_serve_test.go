package main

import (
	"net"
	"strings"
	"testing"
)

// A default address that is taken moves to a free port, with a note; one
// given on the command line is an error naming the flag.
func TestDevListenAddressTaken(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	taken := l.Addr().String()
	addr, note, err := checkListenAddr("metrics-addr", taken, false)
	if err != nil || addr == taken || !strings.HasPrefix(addr, "127.0.0.1:") || !strings.Contains(note, taken+" is taken") {
		t.Errorf("default %s taken: %q, %q, %v; want another loopback port and a note", taken, addr, note, err)
	}
	if _, _, err := checkListenAddr("metrics-addr", taken, true); err == nil || !strings.Contains(err.Error(), "--metrics-addr "+taken) {
		t.Errorf("--metrics-addr %s taken: %v, want an error naming the flag", taken, err)
	}
	if addr, _, err := checkListenAddr("webhook-addr", "0", true); addr != "0" || err != nil {
		t.Errorf(`"0": %q, %v; want it off`, addr, err)
	}
}
