package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capstan-dev/capstan/manifests"
	"github.com/capstan-dev/capstan/stages"
)

// selfInstallFlags say how a pivot stage installs Capstan into the cluster it
// moved a deployment into.
type selfInstallFlags struct {
	image                   string
	hostNetwork             bool
	metricsPort, healthPort int
}

func (f *selfInstallFlags) BindFlags(fs *pflag.FlagSet) {
	fs.StringVar(&f.image, "image", os.Getenv(manifests.ImageEnv),
		"image of this Capstan, which a pivot stage installs into the cluster it moved a deployment into (default $"+manifests.ImageEnv+", which the install manifests set); without one a pivot waits for a Capstan started there by other means")
	fs.BoolVar(&f.hostNetwork, "pivot-host-network", true,
		"run the Capstan a pivot installs on the nodes' network: a cluster just built may have no CNI yet")
	fs.IntVar(&f.metricsPort, "pivot-metrics-port", 0, "metrics port of the Capstan a pivot installs (default 8080)")
	fs.IntVar(&f.healthPort, "pivot-health-port", 0, "health port of the Capstan a pivot installs (default 8081)")
}

// installer returns the installer pivot stages use, nil without an image.
func (f *selfInstallFlags) installer(root rootFlags) stages.Installer {
	if f.image == "" {
		return nil
	}
	src := manifests.Source{}
	if root.url != "" {
		src = manifests.Source{URL: root.url, Branch: root.branch, Path: root.path, Username: root.username, Interval: root.interval.String()}
	}
	// The root source's CA goes along as its password does: as
	// root.options reads it, from the file or the environment (root.options
	// read the file already; should it fail now, a root pivot says so).
	s := &selfInstaller{flags: *f, source: src, password: os.Getenv(sourcePasswordKey), ca: os.Getenv(sourceCAEnv)}
	if root.caFile != "" {
		ca, err := os.ReadFile(root.caFile)
		s.ca, s.caErr = string(ca), err
	}
	return s
}

// selfInstaller installs this Capstan, with its image, into a pivot's
// target: the same manifests as `capstan install`, with the pods pointed
// at the API server the kubeconfig names. The root source and its
// credentials (password, CA) go along only for a root deployment of
// Capstan's own namespace (stages.InstallFor): a tenant's pivot must not
// hand the platform's credentials to a cluster the tenant holds.
type selfInstaller struct {
	flags    selfInstallFlags
	source   manifests.Source
	password string
	ca       string
	caErr    error // reading --source-ca-file
}

// restConfigured is a stages.Cluster that says how it is reached.
type restConfigured interface {
	RESTConfig() *rest.Config
}

func (s *selfInstaller) InstallCRDs(ctx context.Context, target stages.Cluster) error {
	objs, err := manifests.Objects(manifests.Options{Image: s.flags.image})
	if err != nil {
		return err
	}
	var crds []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "CustomResourceDefinition" {
			crds = append(crds, o)
		}
	}
	_, err = manifests.NewInstaller(target.Client(), nil).Apply(ctx, crds)
	return err
}

func (s *selfInstaller) Install(ctx context.Context, target stages.Cluster, f stages.InstallFor) (stages.Installed, error) {
	rc, ok := target.(restConfigured)
	if !ok {
		return stages.Installed{}, errors.New("the target's connection does not say which API server it reaches")
	}
	u, err := url.Parse(rc.RESTConfig().Host)
	if err != nil || u.Host == "" {
		return stages.Installed{}, fmt.Errorf("the target's API server address %q: %v", rc.RESTConfig().Host, err)
	}
	apiServer := u.Host
	if u.Port() == "" {
		apiServer = net.JoinHostPort(u.Hostname(), "443")
	}
	done := stages.Installed{What: "Capstan " + s.flags.image}
	source := s.source
	if !f.RootSource {
		source = manifests.Source{}
		if s.source.URL != "" {
			// The URL itself is not quoted: it may carry credentials.
			done.Withheld = fmt.Sprintf("the root source and its credentials (Secret %s/%s) were not copied: %s; "+
				"if the deployment needs the root source there, give the target's Capstan --source and its own Secret %s/%s (%s, %s)",
				manifests.Namespace, sourceSecretName, f.Why, manifests.Namespace, sourceSecretName, sourcePasswordKey, sourceCAEnv)
		}
	}
	objs, err := manifests.Objects(manifests.Options{
		Image: s.flags.image, Source: source, HostNetwork: s.flags.hostNetwork, APIServer: apiServer,
		MetricsPort: s.flags.metricsPort, HealthPort: s.flags.healthPort,
	})
	if err != nil {
		return stages.Installed{}, err
	}
	c := target.Client()
	if f.RootSource && s.caErr != nil {
		return stages.Installed{}, fmt.Errorf("--source-ca-file: %w", s.caErr)
	}
	if f.RootSource && (s.password != "" || s.ca != "") {
		if err := s.sourceSecret(ctx, c); err != nil {
			return stages.Installed{}, err
		}
	}
	if _, err := manifests.NewInstaller(c, nil).Apply(ctx, objs); err != nil {
		return stages.Installed{}, err
	}
	return done, nil
}

// sourceSecretName is the Secret the installed daemon reads the root
// source's credentials from (manifests/install/deployment.yaml).
const sourceSecretName = "capstan-secrets"

// sourcePasswordKey is the key of the root source's password there.
const sourcePasswordKey = "CAPSTAN_SOURCE_PASSWORD"

// sourceSecret gives the installed daemon the root source's password and
// CA, as `capstan install` expects them: Secret capstan-secrets. It is
// created once; an operator's own Secret there is left alone.
func (s *selfInstaller) sourceSecret(ctx context.Context, c client.Client) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: manifests.Namespace}}
	if err := c.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", manifests.Namespace, err)
	}
	data := map[string]string{}
	if s.password != "" {
		data[sourcePasswordKey] = s.password
	}
	if s.ca != "" {
		data[sourceCAEnv] = s.ca
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: sourceSecretName, Namespace: manifests.Namespace},
		StringData: data,
	}
	if err := c.Create(ctx, secret); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create Secret %s/%s: %w", manifests.Namespace, sourceSecretName, err)
	}
	return nil
}
