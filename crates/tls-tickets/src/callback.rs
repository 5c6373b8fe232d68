//! The OpenSSL session-ticket key callback (`SSL_CTX_set_tlsext_ticket_key_cb`), the only
//! unsafe code in Switchyard. OpenSSL calls it from handshakes on any thread to seal a new
//! ticket (`enc == 1`) or to open one a client presents (`enc == 0`).
#![allow(unsafe_code)]

use std::ffi::{c_int, c_uchar, c_void};

use openssl::ssl::SslContextBuilder;
use openssl_sys as ffi;

use crate::{installed_keys, AES_KEY_LEN, HMAC_KEY_LEN, NAME_LEN};

/// `SSL_CTRL_SET_TLSEXT_TICKET_KEY_CB` from `openssl/ssl.h`; stable across OpenSSL 1.1 and 3.
const SET_TICKET_KEY_CB: c_int = 72;
/// The IV OpenSSL hands the callback is `EVP_MAX_IV_LENGTH` bytes; AES-CBC uses 16.
const IV_LEN: usize = 16;

/// Ticket opened with an older key: resume, and send the client a ticket under the new key.
const RESUME_AND_RENEW: c_int = 2;
const RESUME: c_int = 1;
const SEALED: c_int = 1;
const UNKNOWN_KEY: c_int = 0;
const FAILURE: c_int = -1;

type TicketKeyCallback = unsafe extern "C" fn(
    *mut ffi::SSL,
    *mut c_uchar,
    *mut c_uchar,
    *mut ffi::EVP_CIPHER_CTX,
    *mut ffi::HMAC_CTX,
    c_int,
) -> c_int;

pub(crate) fn set_on(context: &mut SslContextBuilder) -> bool {
    let callback: TicketKeyCallback = ticket_key_callback;
    // SAFETY: OpenSSL stores the pointer and calls it back with the signature above for this
    // command (`SSL_CTX_set_tlsext_ticket_key_cb` is this very call, as a C macro); the
    // transmute only erases the signature the way the C macro's cast does.
    let result = unsafe {
        ffi::SSL_CTX_callback_ctrl__fixed_rust(
            context.as_ptr(),
            SET_TICKET_KEY_CB,
            Some(std::mem::transmute::<
                TicketKeyCallback,
                unsafe extern "C" fn(),
            >(callback)),
        )
    };
    result == 1
}

/// See `SSL_CTX_set_tlsext_ticket_key_cb(3)`: fill `key_name`/`iv` and initialise both
/// contexts when sealing; find the key by `key_name` and initialise when opening.
unsafe extern "C" fn ticket_key_callback(
    _ssl: *mut ffi::SSL,
    key_name: *mut c_uchar,
    iv: *mut c_uchar,
    cipher: *mut ffi::EVP_CIPHER_CTX,
    hmac: *mut ffi::HMAC_CTX,
    enc: c_int,
) -> c_int {
    let Some(keys) = installed_keys() else {
        return FAILURE;
    };
    if key_name.is_null() || iv.is_null() || cipher.is_null() || hmac.is_null() {
        return FAILURE;
    }
    // SAFETY: OpenSSL passes a key-name buffer of TLSEXT_KEYNAME_LENGTH (16) bytes and an IV
    // buffer of EVP_MAX_IV_LENGTH (16) bytes, valid for the duration of the call.
    let (name, iv_bytes) = unsafe {
        (
            std::slice::from_raw_parts_mut(key_name, NAME_LEN),
            std::slice::from_raw_parts_mut(iv, IV_LEN),
        )
    };
    if enc == 1 {
        let Some(key) = keys.current() else {
            return FAILURE;
        };
        if openssl::rand::rand_bytes(iv_bytes).is_err() {
            return FAILURE;
        }
        name.copy_from_slice(&key.name);
        // SAFETY: the contexts come from OpenSSL for this call.
        let ok = unsafe {
            init_cipher(cipher, &key.aes, iv_bytes, Direction::Seal) && init_hmac(hmac, &key.hmac)
        };
        if ok {
            SEALED
        } else {
            FAILURE
        }
    } else {
        let Some((key, current)) = keys.find(name) else {
            return UNKNOWN_KEY;
        };
        // SAFETY: as above.
        let ok = unsafe {
            init_hmac(hmac, &key.hmac) && init_cipher(cipher, &key.aes, iv_bytes, Direction::Open)
        };
        match (ok, current) {
            (false, _) => FAILURE,
            (true, true) => RESUME,
            (true, false) => RESUME_AND_RENEW,
        }
    }
}

/// Whether a ticket is being sealed (issued) or opened (resumed).
#[derive(Clone, Copy)]
enum Direction {
    Seal,
    Open,
}

/// Sets `cipher` up for AES-256-CBC with `key` and `iv` in `direction`.
///
/// # Safety
/// `cipher` must be a valid `EVP_CIPHER_CTX` from OpenSSL; `iv` is at least AES's block.
unsafe fn init_cipher(
    cipher: *mut ffi::EVP_CIPHER_CTX,
    key: &[u8; AES_KEY_LEN],
    iv: &[u8],
    direction: Direction,
) -> bool {
    let encrypt = match direction {
        Direction::Seal => 1,
        Direction::Open => 0,
    };
    // SAFETY: upheld by the caller; the key is the length AES-256 takes (checked below).
    unsafe {
        ffi::EVP_CipherInit_ex(
            cipher,
            ffi::EVP_aes_256_cbc(),
            std::ptr::null_mut(),
            key.as_ptr(),
            iv.as_ptr(),
            encrypt,
        ) == 1
    }
}

/// # Safety
/// `hmac` must be a valid `HMAC_CTX` from OpenSSL.
unsafe fn init_hmac(hmac: *mut ffi::HMAC_CTX, key: &[u8; HMAC_KEY_LEN]) -> bool {
    // SAFETY: upheld by the caller; the key slice is valid for its length.
    unsafe {
        ffi::HMAC_Init_ex(
            hmac,
            key.as_ptr().cast::<c_void>(),
            HMAC_KEY_LEN as c_int,
            ffi::EVP_sha256(),
            std::ptr::null_mut(),
        ) == 1
    }
}

const _: () = assert!(AES_KEY_LEN == 32, "AES-256-CBC takes a 32-byte key");
