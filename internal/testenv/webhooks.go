package testenv

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// A provider's release wires its webhooks to a Service in the cluster with
// kustomize (config/crd/patches/webhook_in_*.yaml for conversion,
// config/webhook/manifests.yaml for admission) and lets cert-manager inject
// the CA. The test control plane has neither Services that reach a process
// nor cert-manager, so the same manifests are rewritten the way envtest
// does: every clientConfig becomes a URL on 127.0.0.1 with the env's CA.

// conversionPatch is what a webhook_in_<plural>.yaml patch of a provider
// says: which CRD converts through the provider's webhook, with which
// ConversionReview versions.
type conversionPatch struct {
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Conversion struct {
			Strategy string `json:"strategy"`
			Webhook  struct {
				ConversionReviewVersions []string `json:"conversionReviewVersions"`
			} `json:"webhook"`
		} `json:"conversion"`
	} `json:"spec"`
}

// crdKustomization is the part of a provider's config/crd/kustomization.yaml
// that Capstan's tests need: the conversion patches it enables (a patch
// commented out there is not enabled in the release, so not here either)
// and the labels it puts on every CRD. Cluster API finds the API version
// of a referenced kind that implements its contract from the labels
// cluster.x-k8s.io/<contract>: <versions>; without them a Cluster never
// resolves its infrastructure or control-plane reference.
type crdKustomization struct {
	Patches []struct {
		Path string `json:"path"`
	} `json:"patches"`
	PatchesStrategicMerge []string          `json:"patchesStrategicMerge"`
	CommonLabels          map[string]string `json:"commonLabels"`
	Labels                []struct {
		Pairs map[string]string `json:"pairs"`
	} `json:"labels"`
}

// crdRelease is how a provider's release installs the CRDs of one folder.
type crdRelease struct {
	// conversions are the CRDs converted through the provider's webhook,
	// by name, with their ConversionReview versions.
	conversions map[string][]string
	// labels go on every CRD of the folder.
	labels map[string]string
}

// readCRDRelease reads the kustomization.yaml beside crdDir (a provider's
// config/crd/bases), the conversion patches it enables and its labels.
func readCRDRelease(crdDir string) (crdRelease, error) {
	base := filepath.Dir(crdDir)
	rel := crdRelease{conversions: map[string][]string{}, labels: map[string]string{}}
	raw, err := os.ReadFile(filepath.Join(base, "kustomization.yaml"))
	if errors.Is(err, os.ErrNotExist) {
		return rel, nil
	}
	if err != nil {
		return rel, fmt.Errorf("read CRD kustomization: %w", err)
	}
	var k crdKustomization
	if err := yaml.Unmarshal(raw, &k); err != nil {
		return rel, fmt.Errorf("read CRD kustomization %s: %w", filepath.Join(base, "kustomization.yaml"), err)
	}
	maps.Copy(rel.labels, k.CommonLabels)
	for _, l := range k.Labels {
		maps.Copy(rel.labels, l.Pairs)
	}
	paths := k.PatchesStrategicMerge
	for _, p := range k.Patches {
		paths = append(paths, p.Path)
	}
	var errs []error
	for _, p := range paths {
		if !strings.HasPrefix(filepath.Base(p), "webhook_in_") {
			continue
		}
		file := filepath.Join(base, filepath.FromSlash(p))
		raw, err := os.ReadFile(file)
		if err != nil {
			errs = append(errs, fmt.Errorf("read conversion patch: %w", err))
			continue
		}
		var patch conversionPatch
		if err := yaml.Unmarshal(raw, &patch); err != nil {
			errs = append(errs, fmt.Errorf("read conversion patch %s: %w", file, err))
			continue
		}
		if patch.Metadata.Name == "" || patch.Spec.Conversion.Strategy != "Webhook" {
			errs = append(errs, fmt.Errorf("conversion patch %s: want a CRD name and strategy Webhook", file))
			continue
		}
		versions := patch.Spec.Conversion.Webhook.ConversionReviewVersions
		if len(versions) == 0 {
			versions = []string{"v1"}
		}
		rel.conversions[patch.Metadata.Name] = versions
	}
	return rel, errors.Join(errs...)
}

// apply returns the CRD as the release installs it: with its labels and,
// if it converts through the webhook, spec.conversion sending every
// conversion to url, trusting caPEM.
func (r crdRelease) apply(d crdDoc, url string, caPEM []byte) (crdDoc, error) {
	var obj map[string]any
	if err := json.Unmarshal(d.json, &obj); err != nil {
		return d, fmt.Errorf("CustomResourceDefinition/%s from %s: %w", d.name, d.source, err)
	}
	if len(r.labels) > 0 {
		meta, _ := obj["metadata"].(map[string]any)
		labels, _ := meta["labels"].(map[string]any)
		if labels == nil {
			labels = map[string]any{}
		}
		for k, v := range r.labels {
			labels[k] = v
		}
		meta["labels"] = labels
	}
	if versions, ok := r.conversions[d.name]; ok {
		spec, _ := obj["spec"].(map[string]any)
		if spec == nil {
			return d, fmt.Errorf("CustomResourceDefinition/%s from %s has no spec", d.name, d.source)
		}
		spec["conversion"] = map[string]any{
			"strategy": "Webhook",
			"webhook": map[string]any{
				"conversionReviewVersions": versions,
				"clientConfig":             map[string]any{"url": url, "caBundle": caPEM},
			},
		}
	}
	js, err := json.Marshal(obj)
	if err != nil {
		return d, fmt.Errorf("encode CustomResourceDefinition/%s: %w", d.name, err)
	}
	d.json = js
	return d, nil
}

// webhookURL is where a provider listening on port serves path.
func webhookURL(port int, path string) string {
	return "https://127.0.0.1:" + strconv.Itoa(port) + path
}

// webhookConfiguration is one Mutating- or ValidatingWebhookConfiguration
// to apply, as JSON.
type webhookConfiguration struct {
	kind, name string
	json       []byte
}

// webhookConfigurations reads a provider's config/webhook/manifests.yaml
// and returns its Mutating- and ValidatingWebhookConfigurations as JSON,
// renamed after the provider (every provider names its own
// "mutating-webhook-configuration") and with each webhook's Service
// replaced by a URL on 127.0.0.1:port with the same path, trusting caPEM.
func webhookConfigurations(path, provider string, port int, caPEM []byte) ([]webhookConfiguration, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read webhooks: %w", err)
	}
	defer f.Close()
	reader := utilyaml.NewYAMLReader(bufio.NewReader(f))
	var out []webhookConfiguration
	for i := 1; ; i++ {
		raw, err := reader.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read webhooks from %s (document %d): %w", path, i, err)
		}
		if len(bytes.TrimSpace(raw)) == 0 {
			continue
		}
		var obj map[string]any
		if err := yaml.Unmarshal(raw, &obj); err != nil {
			return nil, fmt.Errorf("read webhooks from %s (document %d): %w", path, i, err)
		}
		kind, _ := obj["kind"].(string)
		if kind != "MutatingWebhookConfiguration" && kind != "ValidatingWebhookConfiguration" {
			continue
		}
		meta, _ := obj["metadata"].(map[string]any)
		if meta == nil {
			return nil, fmt.Errorf("%s %s (document %d) has no metadata", kind, path, i)
		}
		name := provider + "-" + fmt.Sprint(meta["name"])
		meta["name"] = name
		hooks, _ := obj["webhooks"].([]any)
		for j, h := range hooks {
			hook, _ := h.(map[string]any)
			cc, _ := hook["clientConfig"].(map[string]any)
			svc, _ := cc["service"].(map[string]any)
			if svc == nil {
				return nil, fmt.Errorf("%s/%s in %s: webhook %d has no clientConfig.service to point at 127.0.0.1", kind, name, path, j)
			}
			p, _ := svc["path"].(string)
			hook["clientConfig"] = map[string]any{"url": webhookURL(port, p), "caBundle": caPEM}
		}
		js, err := json.Marshal(obj)
		if err != nil {
			return nil, fmt.Errorf("encode %s/%s: %w", kind, name, err)
		}
		out = append(out, webhookConfiguration{kind: kind, name: name, json: js})
	}
	return out, nil
}
