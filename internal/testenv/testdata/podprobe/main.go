// Command podprobe is the test node's workload: it serves /healthz on
// $PORT and, at start, lists the ConfigMaps of its namespace through the
// API server as its ServiceAccount, the way client-go's in-cluster config
// does, printing the HTTP status it got.
package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
)

const sa = "/var/run/secrets/kubernetes.io/serviceaccount/"

func main() {
	token, err1 := os.ReadFile(sa + "token")
	ca, err2 := os.ReadFile(sa + "ca.crt")
	ns, err3 := os.ReadFile(sa + "namespace")
	if err1 != nil || err2 != nil || err3 != nil {
		fmt.Println("no service account:", err1, err2, err3)
		os.Exit(1)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	url := "https://" + net.JoinHostPort(os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")) +
		"/api/v1/namespaces/" + strings.TrimSpace(string(ns)) + "/configmaps"
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	resp, err := client.Do(req)
	if err != nil {
		fmt.Println("list configmaps:", err)
		os.Exit(1)
	}
	resp.Body.Close()
	fmt.Println("list configmaps:", resp.Status)
	http.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	fmt.Println(http.ListenAndServe("127.0.0.1:"+os.Getenv("PORT"), nil))
	os.Exit(1)
}
