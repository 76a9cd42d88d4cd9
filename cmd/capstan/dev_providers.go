package main

import (
	"fmt"
	"net"
	"regexp"
	"strings"

	"github.com/capstan-dev/capstan/internal/gitserver"
)

// Provider backends of `capstan dev`.
const (
	providersSim  = "sim"
	providersReal = "real"
)

// demoBootInterface is the NIC of the BareMetal Operator's demo hardware
// that a Metal3DataTemplate can take a MAC address from.
const demoBootInterface = "nic-1"

// endpointLine is the API_ENDPOINT substitution of a ClusterDeployment.
var endpointLine = regexp.MustCompile(`(?m)^([ \t]+)API_ENDPOINT:.*$`)

// portOrInterfaceLine are the substitutions localEndpoints sets itself.
var portOrInterfaceLine = regexp.MustCompile(`(?m)^[ \t]+(API_PORT|BOOT_INTERFACE):.*\n`)

// localEndpoints moves every ClusterDeployment that substitutes
// API_ENDPOINT onto 127.0.0.1 and a free port of its own, where
// workload-clusters serves its API server, and onto the NIC the demo
// hardware has. It edits lines, so the comments of the committed copy
// stay. It returns the files and one line per deployment moved.
func localEndpoints(files []gitserver.File) ([]gitserver.File, []string, error) {
	var moved []string
	out := make([]gitserver.File, len(files))
	for i, f := range files {
		out[i] = f
		if !strings.Contains(f.Content, "kind: ClusterDeployment") || !endpointLine.MatchString(f.Content) {
			continue
		}
		port, err := freeLoopbackPort()
		if err != nil {
			return nil, nil, err
		}
		content := portOrInterfaceLine.ReplaceAllString(f.Content, "")
		content = endpointLine.ReplaceAllString(content, fmt.Sprintf("${1}API_ENDPOINT: 127.0.0.1\n${1}API_PORT: \"%d\"\n${1}BOOT_INTERFACE: %s", port, demoBootInterface))
		out[i].Content = content
		moved = append(moved, fmt.Sprintf("%s: API server at 127.0.0.1:%d", f.Path, port))
	}
	return out, moved, nil
}

// freeLoopbackPort is a port that was free on 127.0.0.1 a moment ago.
func freeLoopbackPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
