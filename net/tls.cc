// SPDX-License-Identifier: Apache-2.0
#include "net/tls.h"

#include <memory>
#include <string_view>
#include <vector>

#include <openssl/pem.h>
#include <openssl/x509.h>

#include "common/error.h"
#include "net/wire_convert.h"

namespace psched {
namespace {

constexpr std::string_view kBeginCertificate = "-----BEGIN CERTIFICATE-----";
constexpr std::string_view kEndCertificate = "-----END CERTIFICATE-----";

// Runs `parse` (a kj-tls constructor); a failure becomes "<origin>: '<path>' is not <what>".
template <typename T, typename Parse>
T parse_pem(const ConfigFile& file, std::string_view what, Parse parse) {
  try {
    return parse();
  } catch (const kj::Exception& e) {
    fail_config_file(file, fmt::format("is not {}: {}", what, e.getDescription().cStr()));
  }
}

// Each PEM certificate block in the file, in order; fails when there is none.
std::vector<kj::TlsCertificate> read_certificates(const ConfigFile& file) {
  std::string text = read_config_file(file);
  std::vector<kj::TlsCertificate> certificates;
  for (size_t begin = text.find(kBeginCertificate); begin != std::string::npos;
       begin = text.find(kBeginCertificate, begin + 1)) {
    size_t end = text.find(kEndCertificate, begin);
    size_t length = end == std::string::npos ? end : end + kEndCertificate.size() - begin;
    std::string block = text.substr(begin, length);
    certificates.push_back(parse_pem<kj::TlsCertificate>(file, "a PEM certificate", [&] {
      return kj::TlsCertificate(kj::StringPtr(block.c_str()));
    }));
  }
  if (certificates.empty()) fail_config_file(file, "holds no PEM certificate");
  return certificates;
}

// Whether `key_pem` is the private key of the first certificate in `cert_pem` (both parse).
bool key_matches_certificate(const std::string& cert_pem, const std::string& key_pem) {
  std::unique_ptr<BIO, decltype(&BIO_free)> cert_bio(
      BIO_new_mem_buf(cert_pem.data(), static_cast<int>(cert_pem.size())), &BIO_free);
  std::unique_ptr<BIO, decltype(&BIO_free)> key_bio(
      BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size())), &BIO_free);
  std::unique_ptr<X509, decltype(&X509_free)> cert(
      PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr), &X509_free);
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(
      PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr), &EVP_PKEY_free);
  return cert && key && X509_check_private_key(cert.get(), key.get()) == 1;
}

// A worker's Error for its failed handshake with the shard at `address`.
Error handshake_error(const kj::Exception& e, const std::string& address,
                      const std::string& server_name) {
  const char* cause = e.getDescription().cStr();
  if (e.getType() == kj::Exception::Type::DISCONNECTED)
    return Error(
        ErrorCode::disconnected,
        fmt::format("TLS handshake with shard at {} failed (does the shard serve TLS?): {}",
                    address, cause));
  return Error(ErrorCode::bad_config,
               fmt::format("TLS handshake with shard at {} failed (expected a certificate for "
                           "'{}' signed by a CA in tls.ca_file): {}",
                           address, server_name, cause));
}

kj::TlsContext::Options modern_options() {
  kj::TlsContext::Options options;
  options.useSystemTrustStore = false;
  options.minVersion = kj::TlsVersion::TLS_1_2;
  return options;
}

}  // namespace

kj::Own<kj::TlsContext> server_tls_context(const TlsConfig& config) {
  std::string cert_pem = read_config_file(config.cert_file);
  std::string key_pem = read_config_file(config.key_file);
  warn_if_shared(config.key_file);
  kj::TlsKeypair keypair{
      .privateKey = parse_pem<kj::TlsPrivateKey>(
          config.key_file, "an unencrypted PEM private key",
          [&] { return kj::TlsPrivateKey(kj::StringPtr(key_pem.c_str())); }),
      .certificate = parse_pem<kj::TlsCertificate>(config.cert_file, "a PEM certificate", [&] {
        return kj::TlsCertificate(kj::StringPtr(cert_pem.c_str()));
      })};
  if (!key_matches_certificate(cert_pem, key_pem))
    fail_config_file(config.key_file,
                     fmt::format("is not the private key of {}", config.cert_file.path.string()));
  kj::TlsContext::Options options = modern_options();
  options.defaultKeypair = keypair;
  return kj::heap<kj::TlsContext>(kj::mv(options));
}

kj::Own<kj::TlsContext> client_tls_context(const TlsConfig& config) {
  std::vector<kj::TlsCertificate> trusted = read_certificates(config.ca_file);
  kj::TlsContext::Options options = modern_options();
  options.trustedCertificates = kj::arrayPtr(trusted.data(), trusted.size());
  return kj::heap<kj::TlsContext>(kj::mv(options));
}

std::string expected_server_name(const TlsConfig& config, const std::string& address) {
  return config.server_name.empty() ? parse_listen_address(address).host : config.server_name;
}

kj::Promise<kj::Own<kj::AsyncIoStream>> tls_client_handshake(kj::TlsContext& context,
                                                             kj::Own<kj::AsyncIoStream> stream,
                                                             const std::string& address,
                                                             const std::string& server_name) {
  return context.wrapClient(kj::mv(stream), server_name)
      .catch_([address, server_name](kj::Exception&& e) -> kj::Own<kj::AsyncIoStream> {
        kj::throwFatalException(
            to_kj_exception(std::make_exception_ptr(handshake_error(e, address, server_name))));
      });
}

}  // namespace psched
