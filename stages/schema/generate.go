package schema

//go:generate go run ../../internal/genopenapi -out kubernetes-openapi.json.gz
