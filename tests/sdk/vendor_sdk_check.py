"""The vendors' official SDKs reading what the gateway sent and what the
fakes answer, for tests/tests/vendor_guardrails.rs:

    python vendor_sdk_check.py MOCK_URL KEY AWS_KEY_ID AWS_SECRET REQUESTS_JSON

REQUESTS_JSON: the vendor mock's log (what the gateway sent). For Bedrock's
`ApplyGuardrail` (botocore's service model) and Azure AI Content Safety's
`text:analyze` (azure-ai-contentsafety's models), each request the gateway
made is checked against the SDK's request shape, then sent again through the
SDK's own client to the fake, whose answer the SDK must read. Prints one JSON
object: per vendor, the requests checked, the problems found and what the
SDK read from the fake's answers.
"""
import json
import sys

import botocore.session
from botocore.config import Config
from botocore.validate import ParamValidator
from azure.ai.contentsafety import ContentSafetyClient
from azure.ai.contentsafety.models import AnalyzeTextOptions
from azure.core.credentials import AzureKeyCredential


def bedrock(mock, key_id, secret, requests):
    session = botocore.session.get_session()
    op = session.get_service_model("bedrock-runtime").operation_model("ApplyGuardrail")
    client = session.create_client(
        "bedrock-runtime",
        region_name="us-east-1",
        endpoint_url=mock,
        aws_access_key_id=key_id,
        aws_secret_access_key=secret,
        config=Config(retries={"max_attempts": 1}),
    )
    out = {"checked": 0, "problems": [], "actions": []}
    for r in requests:
        parts = r["path"].split("?")[0].split("/")
        # /guardrail/{id}/version/{version}/apply
        params = {"guardrailIdentifier": parts[2], "guardrailVersion": parts[4], **r["body"]}
        report = ParamValidator().validate(params, op.input_shape)
        if report.has_errors():
            out["problems"].append(report.generate_report())
        out["checked"] += 1
        answer = client.apply_guardrail(**params)
        answer.pop("ResponseMetadata", None)
        report = ParamValidator().validate(answer, op.output_shape)
        if report.has_errors():
            out["problems"].append("answer: " + report.generate_report())
        out["actions"].append(answer["action"])
    return out


def azure(mock, key, requests):
    client = ContentSafetyClient(mock, AzureKeyCredential(key))
    known = {f._rest_name for f in AnalyzeTextOptions(text="x")._attr_to_rest_field.values()}
    out = {"checked": 0, "problems": [], "severities": []}
    for r in requests:
        extra = sorted(set(r["body"]) - known)
        if extra:
            out["problems"].append(f"fields the SDK's AnalyzeTextOptions does not define: {extra}")
        out["checked"] += 1
        result = client.analyze_text(AnalyzeTextOptions(r["body"]))
        out["severities"].append({c.category: c.severity for c in result.categories_analysis})
    return out


def main(mock, key, key_id, secret, path):
    with open(path) as f:
        log = json.load(f)
    of = lambda prefix: [r for r in log if r["path"].startswith(prefix)]
    print(json.dumps({
        "bedrock": bedrock(mock, key_id, secret, of("/guardrail/")),
        "azure": azure(mock, key, of("/contentsafety/text:analyze")),
    }))


if __name__ == "__main__":
    main(*sys.argv[1:6])
