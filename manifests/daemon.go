package manifests

import (
	"fmt"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// DaemonContainerName is the name of Capstan's container in the shipped
// Deployment.
const DaemonContainerName = "capstan"

// DaemonContainer returns Capstan's container as install/deployment.yaml
// ships it: its resources and environment (GOMEMLIMIT) are what the
// memory and scale tests hold the daemon to.
func DaemonContainer() (corev1.Container, error) {
	const file = "install/deployment.yaml"
	data, err := Install.ReadFile(file)
	if err != nil {
		return corev1.Container{}, err
	}
	for _, doc := range strings.Split(string(data), "\n---\n") {
		var dep appsv1.Deployment
		if err := yaml.Unmarshal([]byte(doc), &dep); err != nil || dep.Kind != "Deployment" {
			continue
		}
		for _, ctr := range dep.Spec.Template.Spec.Containers {
			if ctr.Name == DaemonContainerName {
				return ctr, nil
			}
		}
	}
	return corev1.Container{}, fmt.Errorf("manifests/%s: no Deployment with a container named %s", file, DaemonContainerName)
}

// Env returns the value of the environment variable name in ctr, "" when
// it is not set.
func Env(ctr corev1.Container, name string) string {
	for _, e := range ctr.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}
