// libcurl for AdTallyKit on Linux (Transport+Curl.swift). curl_easy_setopt is variadic,
// which Swift cannot call: these take one type each.
#include <curl/curl.h>

typedef size_t (*adtally_curl_data_callback)(char *, size_t, size_t, void *);
typedef int (*adtally_curl_progress_callback)(void *, curl_off_t, curl_off_t, curl_off_t, curl_off_t);

static inline CURLcode adtally_curl_set_long(CURL *handle, CURLoption option, long value) {
    return curl_easy_setopt(handle, option, value);
}
static inline CURLcode adtally_curl_set_pointer(CURL *handle, CURLoption option, const void *value) {
    return curl_easy_setopt(handle, option, value);
}
static inline CURLcode adtally_curl_set_size(CURL *handle, CURLoption option, curl_off_t value) {
    return curl_easy_setopt(handle, option, value);
}
static inline CURLcode adtally_curl_set_data_callback(CURL *handle, CURLoption option, adtally_curl_data_callback callback) {
    return curl_easy_setopt(handle, option, callback);
}
static inline CURLcode adtally_curl_set_progress_callback(CURL *handle, adtally_curl_progress_callback callback) {
    return curl_easy_setopt(handle, CURLOPT_XFERINFOFUNCTION, callback);
}
static inline CURLcode adtally_curl_response_code(CURL *handle, long *code) {
    return curl_easy_getinfo(handle, CURLINFO_RESPONSE_CODE, code);
}
