// Package promserver runs the real Prometheus tools for tests: it finds
// promtool and prometheus, installing Debian's prometheus package when they
// are missing, starts a prometheus server on loopback with a given
// configuration, and reads its alerts and query results over the HTTP API.
//
// Capstan's alert rules are tested with it twice: with `promtool test
// rules` against synthetic series, and with a server that scrapes a real
// daemon in the e2e suite.
package promserver
